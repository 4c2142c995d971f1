//! Paths named in config files: relative ones are relative to the file's folder. A
//! leaf every module that reads a config may use (one definition, the agent's, which
//! reads a config file of its own).

pub use common::resolve;
