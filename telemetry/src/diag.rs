//! Diagnostics that name file, line and column, collected in one pass.

use std::fmt;
use std::ops::Range;

/// One problem found in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub line: usize,
    pub col: usize,
    pub message: String,
}

/// Every problem found in one file, printed one per line as `file:line:col: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostics {
    pub file: String,
    pub problems: Vec<Problem>,
}

impl Diagnostics {
    pub fn is_empty(&self) -> bool {
        self.problems.is_empty()
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}:{}:{}: {}", self.file, p.line, p.col, p.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

/// Collects problems against one source text, turning byte spans into line and column.
pub struct Collector<'a> {
    file: String,
    src: &'a str,
    /// Shape problems (from [`read_all`]): reported first, in their own order.
    shape: Vec<Problem>,
    problems: Vec<Problem>,
}

impl<'a> Collector<'a> {
    pub fn new(file: impl Into<String>, src: &'a str) -> Self {
        Collector {
            file: file.into(),
            src,
            shape: Vec::new(),
            problems: Vec::new(),
        }
    }

    /// Records a problem at the start of `span` (a byte range of the source).
    pub fn at(&mut self, span: Range<usize>, message: impl Into<String>) {
        let (line, col) = line_col(self.src, span.start);
        self.problems.push(Problem {
            line,
            col,
            message: message.into(),
        });
    }

    /// The file's name, as problems print it.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// 1-based line and column of a byte offset of the source.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        line_col(self.src, offset)
    }

    /// Adds the shape problems [`read_all`] found in the same source; they are
    /// reported before the others (so the first line of a report stays the first
    /// thing that stopped the file from reading).
    pub fn extend(&mut self, problems: impl IntoIterator<Item = Problem>) {
        self.shape.extend(problems);
    }

    pub fn has_problems(&self) -> bool {
        !self.problems.is_empty() || !self.shape.is_empty()
    }

    /// `value` when there were no problems, else the problems sorted by position. A
    /// value that could not be made (None) always comes with a problem.
    pub fn finish_with<T>(mut self, value: Option<T>) -> Result<T, Diagnostics> {
        if value.is_none() && !self.has_problems() {
            self.at(0..0, "the file could not be read");
        }
        self.finish()?;
        value.ok_or_else(|| Diagnostics {
            file: String::new(),
            problems: Vec::new(),
        })
    }

    /// The problems, or `Ok` when there were none: the shape problems first, then the
    /// others, each sorted by position.
    pub fn finish(mut self) -> Result<(), Diagnostics> {
        if !self.has_problems() {
            return Ok(());
        }
        // stable: problems at one position keep the order they were found in
        self.shape.sort_by_key(|p| (p.line, p.col));
        self.problems.sort_by_key(|p| (p.line, p.col));
        self.shape.append(&mut self.problems);
        Err(Diagnostics {
            file: self.file,
            problems: self.shape,
        })
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(src.len());
    let before = &src[..floor_char_boundary(src, offset)];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    let col = before[line_start..].chars().count() + 1;
    (line, col)
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Turns a TOML syntax or type error into a diagnostic with its position.
pub fn from_toml_error(file: &str, src: &str, err: &toml::de::Error) -> Diagnostics {
    let (line, col) = err.span().map(|s| line_col(src, s.start)).unwrap_or((1, 1));
    Diagnostics {
        file: file.to_string(),
        problems: vec![Problem {
            line,
            col,
            message: err.message().trim().to_string(),
        }],
    }
}

/// The most shape problems (unknown keys, wrong types) one file reports.
const MAX_SHAPE_PROBLEMS: usize = 50;

/// Deserializes a TOML file into `T` and reports every problem of its shape in one
/// pass (unknown keys, wrong types, missing fields), each at its position.
///
/// serde stops at the first problem, so each problem found is set aside (the line that
/// holds it is commented out, keeping every other byte where it was, so positions stay
/// true) and the file is read again, until it reads or nothing more can be set aside:
/// a missing field, a syntax error or a problem spanning several lines ends the search
/// after it is reported. A required key with a wrong value ends it too (setting its
/// line aside makes the key missing), so problems serde would meet after it show on
/// the next run.
pub fn parse_all<T: serde::de::DeserializeOwned>(file: &str, src: &str) -> Result<T, Diagnostics> {
    let read = read_all::<T>(src);
    match read.value {
        Some(v) if read.problems.is_empty() => Ok(v),
        _ => Err(Diagnostics {
            file: file.to_string(),
            problems: read.problems,
        }),
    }
}

/// What [`read_all`] made of a file: its shape problems, the text with the lines that
/// hold them set aside (every other byte where it was), and the value read from that
/// text when it reads.
#[derive(Debug)]
pub struct Read<T> {
    /// None when no text could be read into `T` (a syntax error, a missing field, a
    /// problem that cannot be set aside).
    pub value: Option<T>,
    /// The source with each set-aside line commented out; positions are those of the
    /// source.
    pub text: String,
    /// The shape problems, sorted by position.
    pub problems: Vec<Problem>,
}

/// Like [`parse_all`], but keeps what reads once the problems are set aside, so that
/// the semantic checks can run on it in the same pass.
pub fn read_all<T: serde::de::DeserializeOwned>(src: &str) -> Read<T> {
    // a syntax error: nothing else can be read reliably
    if let Err(e) = toml::from_str::<toml::Table>(src) {
        let (line, col) = e.span().map(|s| line_col(src, s.start)).unwrap_or((1, 1));
        let message = e.message().trim().to_string();
        return Read {
            value: None,
            text: src.to_string(),
            problems: vec![Problem { line, col, message }],
        };
    }
    let mut text = src.to_string();
    let mut problems: Vec<Problem> = Vec::new();
    let mut set_aside_keys: Vec<String> = Vec::new();
    let mut value = None;
    loop {
        let err = match toml::from_str::<T>(&text) {
            Ok(v) => {
                value = Some(v);
                break;
            }
            Err(e) => e,
        };
        let message = err.message().trim().to_string();
        let (line, col) = err.span().map(|s| line_col(src, s.start)).unwrap_or((1, 1));
        if let Some(field) = missing_field(&message) {
            // a required key whose line was set aside is a consequence, not news
            if !set_aside_keys.iter().any(|k| k == field) {
                problems.push(Problem { line, col, message });
            }
            break;
        }
        if problems
            .iter()
            .any(|p| p.line == line && p.message == message)
        {
            break;
        }
        problems.push(Problem { line, col, message });
        let Some(span) = err.span() else { break };
        match set_aside(&mut text, span) {
            Some(key) if problems.len() < MAX_SHAPE_PROBLEMS => set_aside_keys.push(key),
            _ => break,
        }
    }
    problems.sort_by_key(|p| (p.line, p.col));
    Read {
        value,
        text,
        problems,
    }
}

/// The field a serde "missing field `x`" message names.
fn missing_field(message: &str) -> Option<&str> {
    message.strip_prefix("missing field `")?.split('`').next()
}

/// Comments out the one line holding `span` (same length, so every later position
/// stays) and returns its key; None when that cannot help: the span covers several
/// lines, or its line is a table header or already a comment, or its value goes on
/// over more lines.
fn set_aside(text: &mut String, span: Range<usize>) -> Option<String> {
    let start = floor_char_boundary(text, span.start.min(text.len()));
    let end = floor_char_boundary(text, span.end.min(text.len()));
    if text[start..end].contains('\n') {
        return None;
    }
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    let line = &text[line_start..line_end];
    let trimmed = line.trim_start();
    if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('[') {
        return None;
    }
    let opens = line.matches(['[', '{']).count();
    let closes = line.matches([']', '}']).count();
    if opens != closes || line.contains("\"\"\"") || line.contains("'''") {
        return None;
    }
    let key = trimmed
        .split('=')
        .next()
        .unwrap_or_default()
        .trim()
        .trim_matches('"')
        .to_string();
    let at = line_start + (line.len() - trimmed.len());
    let first = trimmed.chars().next().map_or(1, char::len_utf8);
    text.replace_range(at..at + first, &"#".repeat(first));
    Some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Doc {
        name: String,
        #[serde(default)]
        tick_s: Option<f64>,
        #[serde(default)]
        inner: Option<Inner>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        #[serde(default)]
        size: Option<u32>,
        #[serde(default)]
        kind: Option<Kind>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(rename_all = "snake_case")]
    enum Kind {
        Small,
        Large,
    }

    #[test]
    fn every_shape_problem_is_reported_at_its_place_in_one_pass() {
        let src = "name = \"x\"\ntick_s = \"fast\"\nbogus = 1\n\n[inner]\nsize = -3\nkind = \"huge\"\ncolour = \"red\"\n";
        let err = parse_all::<Doc>("powerplane.toml", src).expect_err("four problems");
        let at: Vec<(usize, usize)> = err.problems.iter().map(|p| (p.line, p.col)).collect();
        assert_eq!(at, [(2, 10), (3, 1), (6, 8), (7, 8), (8, 1)], "{err}");
        let text = err.to_string();
        assert!(
            text.contains("powerplane.toml:3:1: unknown field `bogus`"),
            "{text}"
        );
        assert!(
            text.contains("powerplane.toml:7:8: unknown variant `huge`"),
            "{text}"
        );
    }

    #[test]
    fn a_valid_file_reads_and_a_missing_field_is_reported_once() {
        let ok: Doc = parse_all("a.toml", "name = \"x\"\ntick_s = 1.5\n").expect("valid");
        assert_eq!(ok.tick_s, Some(1.5));
        let err = parse_all::<Doc>("a.toml", "tick_s = 1\nbogus = 2\n").expect_err("bad");
        assert_eq!(err.problems.len(), 2, "{err}");
        assert!(err.to_string().contains("missing field `name`"), "{err}");
    }

    #[test]
    fn a_required_key_with_a_wrong_value_is_reported() {
        let err = parse_all::<Doc>("a.toml", "name = 3\n").expect_err("bad");
        assert_eq!(err.problems.len(), 1, "{err}");
        assert!(
            err.to_string().starts_with("a.toml:1:8: invalid type"),
            "{err}"
        );
    }

    #[test]
    fn a_syntax_error_is_reported_where_it_is() {
        let err = parse_all::<Doc>("a.toml", "name = \"x\"\ntick_s = = 2\n").expect_err("bad");
        assert_eq!(err.problems.len(), 1, "{err}");
        assert_eq!(err.problems[0].line, 2);
    }

    #[test]
    fn line_and_column_are_one_based() {
        let src = "a = 1\nbb = 2\n";
        assert_eq!(line_col(src, 0), (1, 1));
        assert_eq!(line_col(src, 6), (2, 1));
        assert_eq!(line_col(src, 11), (2, 6));
    }

    #[test]
    fn prints_one_line_per_problem_sorted() {
        let src = "x = 1\ny = 2\n";
        let mut c = Collector::new("site.toml", src);
        c.at(6..7, "second");
        c.at(0..1, "first");
        let err = c.finish().expect_err("has problems");
        assert_eq!(
            err.to_string(),
            "site.toml:1:1: first\nsite.toml:2:1: second"
        );
    }
}
