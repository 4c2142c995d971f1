//! Price and carbon series: a value that holds from one instant until the next.

use crate::Timestamp;
use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
pub enum SeriesError {
    #[error("{file}:{line}: {message}")]
    Line {
        file: String,
        line: usize,
        message: String,
    },
    #[error("{file}: no rows")]
    Empty { file: String },
}

/// A step series: each value holds from its start until the next start.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Series {
    points: Vec<(Timestamp, f64)>,
}

impl Series {
    pub fn new(mut points: Vec<(Timestamp, f64)>) -> Self {
        points.sort_by_key(|p| p.0);
        points.dedup_by_key(|p| p.0);
        Series { points }
    }

    /// The value in force at `t`; `None` before the first point.
    pub fn at(&self, t: Timestamp) -> Option<f64> {
        let i = self.points.partition_point(|p| p.0 <= t);
        i.checked_sub(1).map(|i| self.points[i].1)
    }

    /// The start of the step in force at `t`.
    pub fn step_start(&self, t: Timestamp) -> Option<Timestamp> {
        let i = self.points.partition_point(|p| p.0 <= t);
        i.checked_sub(1).map(|i| self.points[i].0)
    }

    pub fn points(&self) -> &[(Timestamp, f64)] {
        &self.points
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// Reads `start,value` rows (RFC 3339 start, a header line first). `column` names
    /// the value column. CSV as [`crate::csvtext`] reads it: quoted fields, CRLF and a
    /// leading byte order mark are fine; `#` lines are comments.
    pub fn from_csv(file: &str, text: &str, column: &str) -> Result<Series, SeriesError> {
        let err = |line: usize, message: String| SeriesError::Line {
            file: file.to_string(),
            line,
            message,
        };
        let rows = crate::csvtext::rows(text, b',').map_err(|e| err(e.line, e.message))?;
        let mut rows = rows.into_iter();
        let head = rows.next().ok_or_else(|| SeriesError::Empty {
            file: file.to_string(),
        })?;
        let (hline, header, cols) = (head.line, head.text, &head.fields);
        let ts_col = cols
            .iter()
            .position(|c| c == "start")
            .ok_or_else(|| err(hline, format!("no `start` column in header {header:?}")))?;
        let v_col = cols
            .iter()
            .position(|c| c == column)
            .ok_or_else(|| err(hline, format!("no `{column}` column in header {header:?}")))?;
        let mut points = Vec::new();
        for row in rows {
            let (i, f) = (row.line, &row.fields);
            let (Some(ts), Some(v)) = (f.get(ts_col), f.get(v_col)) else {
                return Err(err(
                    i,
                    format!("expected {} columns, got {}", cols.len(), f.len()),
                ));
            };
            let ts = Timestamp::parse_rfc3339(ts)
                .map_err(|e| err(i, format!("bad start {ts:?}: {e}")))?;
            let v: f64 = v
                .parse()
                .map_err(|_| err(i, format!("bad {column} {v:?}")))?;
            if !v.is_finite() {
                return Err(err(i, format!("{column} {v} is not finite")));
            }
            points.push((ts, v));
        }
        if points.is_empty() {
            return Err(SeriesError::Empty {
                file: file.to_string(),
            });
        }
        Ok(Series::new(points))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_holds_until_the_next_step() {
        let csv = "start,price_per_kwh\n2024-06-03T00:00:00Z,0.10\n2024-06-03T01:00:00Z,0.30\n";
        let s = Series::from_csv("p.csv", csv, "price_per_kwh").expect("valid");
        let t = |x: &str| Timestamp::parse_rfc3339(x).expect("ts");
        assert_eq!(s.at(t("2024-06-02T23:59:59Z")), None);
        assert_eq!(s.at(t("2024-06-03T00:30:00Z")), Some(0.10));
        assert_eq!(s.at(t("2024-06-03T01:00:00Z")), Some(0.30));
        assert_eq!(s.at(t("2024-06-04T00:00:00Z")), Some(0.30));
    }

    #[test]
    fn bad_rows_name_their_line() {
        let csv = "start,price_per_kwh\n2024-06-03T00:00:00Z,cheap\n";
        assert_eq!(
            Series::from_csv("p.csv", csv, "price_per_kwh"),
            Err(SeriesError::Line {
                file: "p.csv".into(),
                line: 2,
                message: "bad price_per_kwh \"cheap\"".into()
            })
        );
        assert!(Series::from_csv("p.csv", "start,x\n", "price_per_kwh").is_err());
        assert_eq!(
            Series::from_csv("p.csv", "# prices\nbegin,price_per_kwh\n", "price_per_kwh")
                .expect_err("no start")
                .to_string(),
            "p.csv:2: no `start` column in header \"begin,price_per_kwh\""
        );
        let short = "start,note,price_per_kwh\r\n2024-06-03T00:00:00Z,\"a,b\"\r\n";
        assert_eq!(
            Series::from_csv("p.csv", short, "price_per_kwh")
                .expect_err("short")
                .to_string(),
            "p.csv:2: expected 3 columns, got 2"
        );
    }

    fn plain() -> Series {
        let csv = "start,price_per_kwh,carbon_g_per_kwh\n2024-06-03T00:00:00Z,0.10,300\n2024-06-03T01:00:00Z,0.30,250\n";
        Series::from_csv("p.csv", csv, "price_per_kwh").expect("valid")
    }

    #[test]
    fn a_quoted_field_may_hold_the_delimiter() {
        let csv = "start,source,price_per_kwh\n2024-06-03T00:00:00Z,\"EPEX, day-ahead\",0.10\n\"2024-06-03T01:00:00Z\",\"a \"\"b\"\"\",\"0.30\"\n";
        assert_eq!(Series::from_csv("p.csv", csv, "price_per_kwh"), Ok(plain()));
    }

    #[test]
    fn a_byte_order_mark_and_crlf_line_ends_are_read_as_plain_text() {
        let csv = "\u{feff}start,price_per_kwh,carbon_g_per_kwh\r\n2024-06-03T00:00:00Z,0.10,300\r\n\r\n# note\r\n2024-06-03T01:00:00Z,0.30,250\r\n";
        assert_eq!(Series::from_csv("p.csv", csv, "price_per_kwh"), Ok(plain()));
        let bad = "\u{feff}start,price_per_kwh\r\n2024-06-03T00:00:00Z,0.10\r\n\r\n2024-06-03T01:00:00Z,x\r\n";
        assert_eq!(
            Series::from_csv("p.csv", bad, "price_per_kwh")
                .expect_err("bad")
                .to_string(),
            "p.csv:4: bad price_per_kwh \"x\""
        );
    }
}
