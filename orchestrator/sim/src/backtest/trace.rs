//! Job traces: the Philly-derived trace (Pollux artifact), the Pollux workload files,
//! and a generic CSV. Every row error names its `file:line`.
//!
//! Every format is CSV as [`telemetry::csvtext`] reads it: a field may be quoted
//! (`"a,b"`), lines may end in CRLF, a leading byte order mark is dropped, and `#`
//! lines are comments.
//!
//! Generic CSV (header first, columns in any order):
//!
//! | column | required | meaning |
//! | --- | --- | --- |
//! | `submit` | yes | RFC 3339 with offset, `YYYY-MM-DD HH:MM:SS` in the site's time zone, or seconds after the trace start |
//! | `duration_s` | yes | run time at full power, seconds |
//! | `gpus` | yes | GPUs the job needs |
//! | `id` | no | job id (default: `job-<line>`) |
//! | `class` | no | job class; empty: the scenario's rules decide |
//! | `deadline` | no | latest end, written like `submit`; empty: the scenario's rules decide |
//! | `gpu_model` | no | the GPU model the job must run on; empty: any |
//! | `workload` | no | a measured power/speed curve (e.g. `imagenet/resnet50/bs128`); empty: drawn with the seed |

use std::collections::BTreeMap;

use chrono::NaiveDateTime;

/// When something happens, as the trace writes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum When {
    /// Wall-clock time without a zone: read in the site's time zone.
    Local(NaiveDateTime),
    /// An instant (RFC 3339 with offset).
    Instant(telemetry::Timestamp),
    /// Seconds after the trace's start.
    Offset(f64),
}

/// One job of a trace, before alignment.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceJob {
    pub id: String,
    pub submit: When,
    pub duration_s: f64,
    pub gpus: u32,
    pub class: Option<String>,
    pub deadline: Option<When>,
    pub gpu_model: Option<String>,
    pub workload: Option<String>,
    /// The line it came from (1-based).
    pub line: usize,
}

/// What kind of trace a header says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Philly,
    Pollux,
    Generic,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Philly => "Philly-derived (Pollux artifact)",
            Format::Pollux => "Pollux workload",
            Format::Generic => "generic CSV",
        }
    }
}

/// Assumed run times of the Pollux workload's applications (the file gives none), in
/// hours at the job's GPU count, and the measured curve each one runs on.
pub fn pollux_application(app: &str) -> Option<(f64, &'static str)> {
    Some(match app {
        "cifar10" => (1.0, "cifar100/shufflenetv2/bs128"),
        "imagenet" => (12.0, "imagenet/resnet50/bs128"),
        "deepspeech2" => (4.0, "librispeech/deepspeech2/bs32"),
        "ncf" => (0.5, "movielens-1m/ncf/bs1024"),
        "bert" => (2.0, "squad/bert_base_uncased/bs32"),
        "yolov3" => (6.0, "imagenet/resnet50/bs64"),
        _ => return None,
    })
}

fn err(file: &str, line: usize, msg: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{file}:{line}: {msg}")
}

fn parse_when(s: &str) -> Option<When> {
    let s = s.trim();
    if let Ok(t) = telemetry::Timestamp::parse_rfc3339(s) {
        return Some(When::Instant(t));
    }
    for f in ["%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"] {
        if let Ok(n) = NaiveDateTime::parse_from_str(s, f) {
            return Some(When::Local(n));
        }
    }
    s.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .map(When::Offset)
}

/// Where a job id falls in `[0, 1)`, the same on every run and machine: FNV-1a over
/// its bytes, then a 64-bit finalizer (FNV alone leaves ids that differ in their last
/// digit close together in the high bits).
fn draw(id: &str) -> f64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// The trace's load scaled by `factor` (`--load`, and `--capacity` with the site):
/// every job `floor(factor)` times, and once more where its id's draw falls under
/// the fraction left. The copies keep the job's submission, length, size and class
/// (ids `<id>+1`, `<id>+2`, ...), so the load's shape over the day and the week is the
/// trace's own. Below 1 it is a subsample, and a smaller factor's jobs are among a
/// larger one's. `factor` 1 returns the trace as it is.
pub fn scaled(jobs: Vec<TraceJob>, factor: f64) -> Vec<TraceJob> {
    if factor == 1.0 {
        return jobs;
    }
    let whole = factor.floor().max(0.0) as usize;
    let part = factor - factor.floor();
    let mut out = Vec::with_capacity((jobs.len() as f64 * factor.max(0.0)).ceil() as usize);
    for j in jobs {
        let copies = whole + usize::from(draw(&j.id) < part);
        for k in 0..copies {
            let mut c = j.clone();
            if k > 0 {
                c.id = format!("{}+{k}", j.id);
            }
            out.push(c);
        }
    }
    out
}

/// Reads a trace, recognising its format by its header.
pub fn parse(file: &str, text: &str) -> anyhow::Result<(Format, Vec<TraceJob>)> {
    let rows = telemetry::csvtext::rows(text, b',').map_err(|e| err(file, e.line, e))?;
    let mut rows = rows.into_iter();
    let head = rows
        .next()
        .ok_or_else(|| anyhow::anyhow!("{file}: empty trace"))?;
    let (hl, header, cols) = (head.line, head.text, &head.fields);
    let idx: BTreeMap<&str, usize> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| (c.as_str(), i))
        .collect();
    let format = Format::of_header(file, hl, header, &idx)?;
    let mut jobs = Vec::new();
    for row in rows {
        let (ln, f) = (row.line, row.fields);
        if f.len() < cols.len() {
            return Err(err(
                file,
                ln,
                format!("expected {} columns, got {}", cols.len(), f.len()),
            ));
        }
        let row = Row {
            file,
            ln,
            fields: f,
            idx: &idx,
        };
        let job = match format {
            Format::Philly => row.philly()?,
            Format::Pollux => row.pollux()?,
            Format::Generic => row.generic()?,
        };
        if job.duration_s <= 0.0 {
            // a job that ran for no time (the Philly trace has a few): nothing to replay
            continue;
        }
        jobs.push(job);
    }
    if jobs.is_empty() {
        return Err(anyhow::anyhow!("{file}: no jobs"));
    }
    Ok((format, jobs))
}

impl Format {
    /// The format a header (line `hl`, columns `idx`) says, with the columns it needs.
    fn of_header(
        file: &str,
        hl: usize,
        header: &str,
        idx: &BTreeMap<&str, usize>,
    ) -> anyhow::Result<Format> {
        let has = |c: &str| idx.contains_key(c);
        let format = if has("num_gpus") && has("timestamp") {
            Format::Philly
        } else if has("num_replicas") && has("application") {
            Format::Pollux
        } else if has("submit") || has("duration_s") || has("gpus") {
            Format::Generic
        } else {
            return Err(err(
                file,
                hl,
                format!(
                    "unknown trace header {header:?}: expected the Philly-derived trace \
                     (timestamp,duration,num_gpus,...), a Pollux workload \
                     (name,time,application,num_replicas,...) or the generic CSV \
                     (submit,duration_s,gpus[,id,class,deadline,gpu_model,workload])"
                ),
            ));
        };
        let required: &[&str] = match format {
            Format::Philly => &["timestamp", "duration", "num_gpus"],
            Format::Pollux => &["name", "time", "application", "num_replicas"],
            Format::Generic => &["submit", "duration_s", "gpus"],
        };
        for c in required {
            if !has(c) {
                return Err(err(
                    file,
                    hl,
                    format!(
                        "missing column {c:?} for a {} trace (header {header:?})",
                        format.name()
                    ),
                ));
            }
        }
        Ok(format)
    }
}

/// One row of a trace: its fields, read by column name.
struct Row<'a> {
    file: &'a str,
    ln: usize,
    fields: Vec<String>,
    idx: &'a BTreeMap<&'a str, usize>,
}

impl Row<'_> {
    fn get(&self, c: &str) -> &str {
        self.idx
            .get(c)
            .copied()
            .map_or("", |i| self.fields[i].as_str())
    }

    fn opt(&self, c: &str) -> Option<String> {
        Some(self.get(c))
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    }

    fn num(&self, c: &str) -> anyhow::Result<f64> {
        let v = self.get(c);
        v.parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| {
                err(
                    self.file,
                    self.ln,
                    format!("{c} {v:?} is not a non-negative number"),
                )
            })
    }

    fn gpus(&self, c: &str) -> anyhow::Result<u32> {
        let v = self.get(c);
        v.parse::<u32>().ok().filter(|g| *g >= 1).ok_or_else(|| {
            err(
                self.file,
                self.ln,
                format!("{c} {v:?} is not a GPU count (1 or more)"),
            )
        })
    }

    fn philly(&self) -> anyhow::Result<TraceJob> {
        let (file, ln) = (self.file, self.ln);
        let ts = self.get("timestamp");
        let submit = NaiveDateTime::parse_from_str(ts, "%Y-%m-%d %H:%M:%S")
            .map_err(|e| err(file, ln, format!("timestamp {ts:?}: {e}")))?;
        Ok(TraceJob {
            id: format!("philly-{ln}"),
            submit: When::Local(submit),
            duration_s: self.num("duration")?,
            gpus: self.gpus("num_gpus")?,
            class: None,
            deadline: None,
            gpu_model: None,
            workload: None,
            line: ln,
        })
    }

    fn pollux(&self) -> anyhow::Result<TraceJob> {
        let (file, ln) = (self.file, self.ln);
        let app = self.get("application");
        let (hours, curve) = pollux_application(app)
            .ok_or_else(|| err(file, ln, format!("unknown Pollux application {app:?}")))?;
        Ok(TraceJob {
            id: format!("pollux-{}", self.get("name")),
            submit: When::Offset(self.num("time")?),
            duration_s: hours * 3600.0,
            gpus: self.gpus("num_replicas")?,
            class: None,
            deadline: None,
            gpu_model: None,
            workload: Some(curve.to_string()),
            line: ln,
        })
    }

    fn generic(&self) -> anyhow::Result<TraceJob> {
        let (file, ln) = (self.file, self.ln);
        let s = self.get("submit");
        let submit =
            parse_when(s).ok_or_else(|| err(file, ln, format!("submit {s:?} is not a time")))?;
        let deadline = match self.opt("deadline") {
            Some(d) => Some(
                parse_when(&d)
                    .ok_or_else(|| err(file, ln, format!("deadline {d:?} is not a time")))?,
            ),
            None => None,
        };
        Ok(TraceJob {
            id: self.opt("id").unwrap_or_else(|| format!("job-{ln}")),
            submit,
            duration_s: self.num("duration_s")?,
            gpus: self.gpus("gpus")?,
            class: self.opt("class"),
            deadline,
            gpu_model: self.opt("gpu_model"),
            workload: self.opt("workload"),
            line: ln,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_format_is_recognised_by_its_header() {
        let philly = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66.0,1,66.0,11cb48\n";
        let (f, j) = parse("p.csv", philly).expect("philly");
        assert_eq!(f, Format::Philly);
        assert_eq!((j[0].duration_s, j[0].gpus), (66.0, 1));
        let pollux =
            "name,time,application,num_replicas,batch_size\ncifar10-0,107,cifar10,6,2048\n";
        let (f, j) = parse("w.csv", pollux).expect("pollux");
        assert_eq!(f, Format::Pollux);
        assert_eq!(j[0].submit, When::Offset(107.0));
        assert_eq!(j[0].gpus, 6);
        let generic =
            "submit,duration_s,gpus,class,deadline\n2024-06-03T10:00:00+02:00,600,2,batch,\n";
        let (f, j) = parse("g.csv", generic).expect("generic");
        assert_eq!(f, Format::Generic);
        assert_eq!(j[0].class.as_deref(), Some("batch"));
        assert_eq!(j[0].deadline, None);
    }

    #[test]
    fn a_quoted_field_may_hold_a_comma() {
        let text = "id,submit,duration_s,gpus,class,workload\n\"a,1\",\"2024-06-03 10:00:00\",600,2,\"batch\",\"x, \"\"y\"\"\"\nb,0,60,1,,\n";
        let (f, j) = parse("g.csv", text).expect("generic");
        assert_eq!(f, Format::Generic);
        assert_eq!(j[0].id, "a,1");
        assert_eq!(j[0].gpus, 2);
        assert_eq!(j[0].class.as_deref(), Some("batch"));
        assert_eq!(j[0].workload.as_deref(), Some("x, \"y\""));
        assert_eq!((j[1].id.as_str(), j[1].line), ("b", 3));
    }

    #[test]
    fn a_byte_order_mark_and_crlf_line_ends_are_read_as_plain_text() {
        let lf = "# exported\ntimestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66.0,1,66.0,11cb48\n\n2017-10-09 07:02:10,120.0,4,480.0,11cb48\n";
        let crlf = format!("\u{feff}{}", lf.replace('\n', "\r\n"));
        let (f, j) = parse("p.csv", &crlf).expect("philly");
        assert_eq!(f, Format::Philly);
        assert_eq!(parse("p.csv", lf).expect("philly"), (f, j.clone()));
        assert_eq!(
            j.iter()
                .map(|j| (j.id.as_str(), j.line))
                .collect::<Vec<_>>(),
            [("philly-3", 3), ("philly-5", 5)]
        );
        let bad = crlf.replace("120.0", "long");
        assert_eq!(
            parse("p.csv", &bad).expect_err("bad").to_string(),
            "p.csv:5: duration \"long\" is not a non-negative number"
        );
    }

    #[test]
    fn bad_rows_and_missing_columns_name_file_and_line() {
        let e = parse("g.csv", "submit,gpus\n0,1\n").expect_err("missing");
        assert!(
            e.to_string()
                .starts_with("g.csv:1: missing column \"duration_s\""),
            "{e}"
        );
        let e = parse("g.csv", "submit,duration_s,gpus\n0,60,1\n# c\n0,sixty,1\n")
            .expect_err("bad number");
        assert_eq!(
            e.to_string(),
            "g.csv:4: duration_s \"sixty\" is not a non-negative number"
        );
        let e = parse("g.csv", "submit,duration_s,gpus\n0,60\n").expect_err("short row");
        assert_eq!(e.to_string(), "g.csv:2: expected 3 columns, got 2");
        let e = parse("p.csv", "\u{feff}a,b\r\n1,2\r\n").expect_err("unknown");
        assert!(
            e.to_string()
                .starts_with("p.csv:1: unknown trace header \"a,b\""),
            "{e}"
        );
        let e = parse("g.csv", "submit,duration_s,gpus\r\n\"0,60\"\r\n").expect_err("short");
        assert_eq!(e.to_string(), "g.csv:2: expected 3 columns, got 1");
        let e = parse("p.csv", "a,b\n1,2\n").expect_err("unknown");
        assert!(
            e.to_string().starts_with("p.csv:1: unknown trace header"),
            "{e}"
        );
    }
}
