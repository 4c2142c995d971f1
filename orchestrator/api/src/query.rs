//! Query strings and form bodies of the HTTP API, decoded as
//! `application/x-www-form-urlencoded` (axum's query decoder: serde_urlencoded).

use axum::extract::Query;
use axum::http::Uri;

/// A query string that does not decode.
#[derive(Debug, thiserror::Error)]
pub enum BadQuery {
    #[error("bad query string {query:?}: {source}")]
    Uri {
        query: String,
        #[source]
        source: axum::http::uri::InvalidUri,
    },
    #[error("bad query string {query:?}: {source}")]
    Decode {
        query: String,
        #[source]
        source: axum::extract::rejection::QueryRejection,
    },
}

/// The `key=value` pairs of a query string (the part after `?`), percent-decoded and
/// with `+` as a space, in order.
pub fn pairs(query: &str) -> Result<Vec<(String, String)>, BadQuery> {
    if query.is_empty() {
        return Ok(Vec::new());
    }
    let uri: Uri = format!("/?{query}")
        .parse()
        .map_err(|source| BadQuery::Uri {
            query: query.to_string(),
            source,
        })?;
    Query::<Vec<(String, String)>>::try_from_uri(&uri)
        .map(|q| q.0)
        .map_err(|source| BadQuery::Decode {
            query: query.to_string(),
            source,
        })
}

/// The value of `key` in a form body (`a=1&b=2`), decoded.
pub fn form_field(body: &[u8], key: &str) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    pairs(text.trim())
        .ok()?
        .into_iter()
        .find_map(|(k, v)| (k == key).then_some(v))
}

/// A time whose `+hh:mm` offset came unencoded (`...T09:00:00+01:00` typed into a
/// URL decodes as `...T09:00:00 01:00`): the space before the offset back to `+`.
/// A time that was sent encoded (`%2B01:00`) is returned as it is.
pub fn offset_plus(v: &str) -> String {
    let b = v.as_bytes();
    let n = b.len();
    let offset_like = n > 6
        && b[n - 6] == b' '
        && b[n - 3] == b':'
        && [1, 2, 4, 5].iter().all(|&i| b[n - 6 + i].is_ascii_digit());
    if offset_like {
        format!("{}+{}", &v[..n - 6], &v[n - 5..])
    } else {
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_percent_decoded_and_plus_is_a_space() {
        let got = pairs("since=2026-01-01T00%3A00%3A00%2B01%3A00&target=rack%2Fa01&rule=a+b")
            .expect("decoded");
        assert_eq!(
            got,
            vec![
                ("since".into(), "2026-01-01T00:00:00+01:00".into()),
                ("target".into(), "rack/a01".into()),
                ("rule".into(), "a b".into()),
            ]
        );
        assert_eq!(pairs("").expect("empty"), vec![]);
    }

    #[test]
    fn an_unencoded_offset_gets_its_plus_back() {
        let typed = pairs("since=2026-01-01T00:00:00+01:00").expect("decoded");
        assert_eq!(typed[0].1, "2026-01-01T00:00:00 01:00");
        assert_eq!(offset_plus(&typed[0].1), "2026-01-01T00:00:00+01:00");
        assert_eq!(offset_plus("2026-01-01T00:00:00Z"), "2026-01-01T00:00:00Z");
        assert_eq!(offset_plus("a b"), "a b");
    }

    #[test]
    fn a_form_field_is_found_and_decoded() {
        assert_eq!(
            form_field(b"next=%2F&token=abc%2Bdef", "token").as_deref(),
            Some("abc+def")
        );
        assert_eq!(form_field(b"other=1", "token"), None);
    }
}
