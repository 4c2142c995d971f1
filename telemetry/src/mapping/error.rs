//! Why a value of a message gave no sample (the text goes into the reject's detail).

use thiserror::Error;

use crate::entity::EntityError;
use crate::Metric;

/// Why a Sparkplug metric's value gave no sample.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SampleError {
    /// The rule's entity template, filled, is not an entity.
    #[error(transparent)]
    Entity(#[from] EntityError),
    /// The value's unit cannot be converted to the metric's.
    #[error("{0} cannot be converted")]
    Unconvertible(Metric),
}

/// Why an element of a JSON message names no entity.
#[derive(Debug, Clone, PartialEq, Error)]
pub(super) enum ElementError {
    #[error("no value at {0} for the entity")]
    NoValue(String),
    #[error(transparent)]
    Entity(#[from] EntityError),
}

/// Why a JSON value is not a time.
#[derive(Debug, Clone, PartialEq, Error)]
pub(super) enum TimeError {
    #[error("timestamp {text:?}: {source}")]
    Rfc3339 {
        text: String,
        #[source]
        source: chrono::ParseError,
    },
    #[error("timestamp {0} is not a time")]
    NotATime(String),
}
