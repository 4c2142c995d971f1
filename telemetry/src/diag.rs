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
    problems: Vec<Problem>,
}

impl<'a> Collector<'a> {
    pub fn new(file: impl Into<String>, src: &'a str) -> Self {
        Collector {
            file: file.into(),
            src,
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

    pub fn has_problems(&self) -> bool {
        !self.problems.is_empty()
    }

    /// The problems, sorted by position, or `Ok` when there were none.
    pub fn finish(mut self) -> Result<(), Diagnostics> {
        if self.problems.is_empty() {
            return Ok(());
        }
        self.problems.sort_by_key(|p| (p.line, p.col));
        Err(Diagnostics {
            file: self.file,
            problems: self.problems,
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

#[cfg(test)]
mod tests {
    use super::*;

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
