//! CSV as the feeds and traces are written: read by the `csv` crate, so a field may be
//! quoted (`"a,b"`, `""` for a quote inside), lines may end in CRLF, and a leading UTF-8
//! byte order mark is dropped. Fields are trimmed, a line starting with `#` is a
//! comment, a blank line is skipped, and rows may have any number of fields (the
//! readers count them against the header themselves).

/// One row of a CSV text.
#[derive(Debug, Clone, PartialEq)]
pub struct Row<'a> {
    /// The line the row starts on (1-based, counting comments and blank lines).
    pub line: usize,
    /// Its fields, unquoted and trimmed.
    pub fields: Vec<String>,
    /// The source line it starts on, as written (for messages that quote a header).
    pub text: &'a str,
}

/// Why a CSV text could not be read (the `csv` crate's error, at its line).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct CsvError {
    /// 1-based; 0 where the reader could not tell.
    pub line: usize,
    pub message: String,
}

/// The rows of `text`, fields split at `delimiter` (an ASCII character).
pub fn rows(text: &str, delimiter: u8) -> Result<Vec<Row<'_>>, CsvError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(csv::Trim::All)
        .comment(Some(b'#'))
        .delimiter(delimiter)
        .from_reader(text.as_bytes());
    let mut out = Vec::new();
    // csv places a record where the previous one ended (before its line end and any
    // blank or comment lines csv skipped): the row's own line is counted from there.
    let (mut counted, mut lines) = (0, 1);
    for record in reader.records() {
        let record = record.map_err(|e| CsvError {
            line: e.position().map_or(0, |p| p.line() as usize),
            message: e.to_string(),
        })?;
        if record.len() == 1 && record[0].is_empty() {
            continue; // a line of blanks
        }
        let from = record.position().map_or(0, |p| p.byte() as usize);
        let start = row_start(text, from);
        lines += text
            .get(counted..start)
            .map_or(0, |t| t.bytes().filter(|b| *b == b'\n').count());
        counted = start;
        out.push(Row {
            line: lines,
            fields: record.iter().map(str::to_string).collect(),
            text: text
                .get(start..)
                .and_then(|rest| rest.lines().next())
                .unwrap_or(""),
        });
    }
    Ok(out)
}

/// Where the row csv places at byte `from` begins: past line ends and `#` lines.
fn row_start(text: &str, from: usize) -> usize {
    let bytes = text.as_bytes();
    let mut at = from.min(bytes.len());
    loop {
        while at < bytes.len() && matches!(bytes[at], b'\r' | b'\n') {
            at += 1;
        }
        if bytes.get(at) != Some(&b'#') {
            return at;
        }
        while at < bytes.len() && !matches!(bytes[at], b'\r' | b'\n') {
            at += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(text: &str) -> Vec<(usize, Vec<String>)> {
        rows(text, b',')
            .expect("rows")
            .into_iter()
            .map(|r| (r.line, r.fields))
            .collect()
    }

    fn v(f: &[&str]) -> Vec<String> {
        f.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn comments_and_blank_lines_are_skipped_but_counted() {
        let text = "# a comment\na, b\n\n   \nc ,d,e\n#x,y\n f\n";
        assert_eq!(
            fields(text),
            vec![
                (2, v(&["a", "b"])),
                (5, v(&["c", "d", "e"])),
                (7, v(&["f"]))
            ]
        );
        assert_eq!(rows(text, b',').expect("rows")[0].text, "a, b");
    }

    #[test]
    fn quoted_fields_crlf_and_a_bom() {
        let text =
            "\u{feff}name,note\r\n\"a,b\",\"say \"\"hi\"\"\"\r\n\r\nc,\"two\r\nlines\"\r\nd,e\r\n";
        assert_eq!(
            fields(text),
            vec![
                (1, v(&["name", "note"])),
                (2, v(&["a,b", "say \"hi\""])),
                (4, v(&["c", "two\r\nlines"])),
                (6, v(&["d", "e"])),
            ]
        );
        assert_eq!(rows(text, b',').expect("rows")[0].text, "name,note");
    }

    #[test]
    fn another_delimiter() {
        let r = rows("a;b,c\n1;2,5\n", b';').expect("rows");
        assert_eq!(r[1].fields, v(&["1", "2,5"]));
    }
}
