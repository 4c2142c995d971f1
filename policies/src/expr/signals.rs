//! A signal's dotted name and arguments resolved: `sum(power_w)`, `headroom(power_w)`,
//! `price.p75(24h)`, `hour`, `job.slack_s`, `queue.short_gpus`, or a metric.

use super::lex::Tok;
use super::{Agg, JobField, QueueField, Series, Signal, Span, Stat, TimeField};

/// Why a name with its arguments is not a signal.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SignalError {
    #[error("`{0}` takes no arguments")]
    NoArguments(String),
    #[error("{0} takes a duration with a unit, such as 6h or 90m")]
    DurationWithoutUnit(String),
    #[error("{0} takes a duration such as 24h")]
    NotADuration(String),
    #[error("{0} takes one metric name, e.g. {0}(power_w)")]
    NotOneMetric(String),
    #[error("{series}.cheapest: {hours} h cannot fit in a window of {window_h} h")]
    CheapestOverWindow {
        series: String,
        hours: f64,
        window_h: f64,
    },
    #[error("percentile {0} is outside 0..100")]
    PercentileOutOfRange(f64),
    #[error("unknown signal `{path}`: {series} takes .now, .min(W), .max(W), .mean(W), .pNN(W), .cheapest(H, W) or .cheapest_before_deadline")]
    UnknownStat { path: String, series: String },
    #[error("unknown job field `{0}`: job.priority, job.gpus, job.wait_s, job.slack_s or job.est_duration_s")]
    UnknownJobField(String),
    #[error(
        "unknown queue field `{0}`: queue.jobs, queue.gpus, queue.short_gpus or queue.min_slack_s"
    )]
    UnknownQueueField(String),
    #[error("unknown signal `{0}`")]
    Unknown(String),
}

fn dur_arg(args: &[(Tok, Span)], i: usize, what: &str) -> Result<f64, SignalError> {
    match args.get(i) {
        Some((Tok::Dur(d), _)) if *d > 0.0 => Ok(*d),
        Some((Tok::Num(_), _)) => Err(SignalError::DurationWithoutUnit(what.to_string())),
        _ => Err(SignalError::NotADuration(what.to_string())),
    }
}

fn name_arg(args: &[(Tok, Span)], what: &str) -> Result<String, SignalError> {
    match args {
        [(Tok::Name(n), _)] => Ok(n.clone()),
        _ => Err(SignalError::NotOneMetric(what.to_string())),
    }
}

/// Turns a dotted name with arguments into a signal, or says why it is not one.
pub(super) fn resolve(path: &[String], args: &[(Tok, Span)]) -> Result<Signal, SignalError> {
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    let no_args = |s: Signal| {
        if args.is_empty() {
            Ok(s)
        } else {
            Err(SignalError::NoArguments(p.join(".")))
        }
    };
    match p.as_slice() {
        [agg @ ("sum" | "max" | "min" | "avg")] => {
            let a = match *agg {
                "sum" => Agg::Sum,
                "max" => Agg::Max,
                "min" => Agg::Min,
                _ => Agg::Avg,
            };
            Ok(Signal::Gpus(a, name_arg(args, agg)?))
        }
        ["headroom"] => Ok(Signal::Headroom(name_arg(args, "headroom")?)),
        [s @ ("price" | "carbon"), rest @ ..] => {
            let series = if *s == "price" {
                Series::Price
            } else {
                Series::Carbon
            };
            Ok(Signal::Forecast(series, stat(&p, s, rest, args)?))
        }
        [t @ ("hour" | "minute" | "weekday" | "day" | "month" | "weekend")] => {
            no_args(Signal::Time(match *t {
                "hour" => TimeField::Hour,
                "minute" => TimeField::Minute,
                "weekday" => TimeField::Weekday,
                "day" => TimeField::Day,
                "month" => TimeField::Month,
                _ => TimeField::Weekend,
            }))
        }
        ["job", f] => no_args(Signal::Job(job_field(f)?)),
        ["queue", f] => no_args(Signal::Queue(queue_field(f)?)),
        [metric] => no_args(Signal::Metric(metric.to_string())),
        _ => Err(SignalError::Unknown(p.join("."))),
    }
}

/// A forecast's statistic: `s` is the series' name, `rest` what follows it in the
/// dotted name `p`.
fn stat(p: &[&str], s: &str, rest: &[&str], args: &[(Tok, Span)]) -> Result<Stat, SignalError> {
    Ok(match rest {
        [] if args.is_empty() => Stat::Now,
        ["now"] => Stat::Now,
        ["min"] => Stat::Min(dur_arg(args, 0, &format!("{s}.min"))?),
        ["max"] => Stat::Max(dur_arg(args, 0, &format!("{s}.max"))?),
        ["mean"] => Stat::Mean(dur_arg(args, 0, &format!("{s}.mean"))?),
        ["cheapest"] => {
            let n = dur_arg(args, 0, &format!("{s}.cheapest"))?;
            let w = dur_arg(args, 1, &format!("{s}.cheapest(hours, window)"))?;
            if n > w {
                return Err(SignalError::CheapestOverWindow {
                    series: s.to_string(),
                    hours: n / 3600.0,
                    window_h: w / 3600.0,
                });
            }
            Stat::Cheapest(n / 3600.0, w)
        }
        ["cheapest_before_deadline"] if args.is_empty() => Stat::CheapestBeforeDeadline,
        [pct] if pct.starts_with('p') && pct[1..].parse::<f64>().is_ok() => {
            let p: f64 = pct[1..].parse().unwrap_or(50.0);
            if !(0.0..=100.0).contains(&p) {
                return Err(SignalError::PercentileOutOfRange(p));
            }
            Stat::Pct(p, dur_arg(args, 0, &format!("{s}.{pct}"))?)
        }
        _ => {
            return Err(SignalError::UnknownStat {
                path: p.join("."),
                series: s.to_string(),
            })
        }
    })
}

/// A job's field by its name after `job.`.
fn job_field(f: &str) -> Result<JobField, SignalError> {
    Ok(match f {
        "priority" => JobField::Priority,
        "gpus" => JobField::Gpus,
        "wait_s" => JobField::WaitS,
        "slack_s" => JobField::SlackS,
        "est_duration_s" => JobField::EstDurationS,
        other => return Err(SignalError::UnknownJobField(other.to_string())),
    })
}

/// A field of the queue by its name after `queue.`.
fn queue_field(f: &str) -> Result<QueueField, SignalError> {
    Ok(match f {
        "jobs" => QueueField::Jobs,
        "gpus" => QueueField::Gpus,
        "short_gpus" => QueueField::ShortGpus,
        "min_slack_s" => QueueField::MinSlackS,
        other => return Err(SignalError::UnknownQueueField(other.to_string())),
    })
}
