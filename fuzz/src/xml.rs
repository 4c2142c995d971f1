//! XML mutations: a seed read into a small tree of our own (namespace URI and local
//! name per element and attribute, text), changed structurally, and written back with
//! each namespace declared on the element that uses it (so a moved or grafted element
//! still reads in its namespace).
//!
//! The mutations: an edge value in a text or an attribute (durations like `PT-5M` and
//! `P1000000Y`, impossible date-times, `1e999`, `NaN`, huge numbers and strings), an
//! element removed, renamed, moved to another namespace, copied up to 20,000 times,
//! wrapped 300 deep, siblings swapped, an element grafted from another seed, raw
//! entities and markup in a text.

use common::rng::Rng;

use crate::bytes::below;

/// An element or a text.
#[derive(Debug, Clone, PartialEq)]
pub enum XNode {
    Elem {
        ns: String,
        name: String,
        attrs: Vec<(String, String, String)>,
        children: Vec<XNode>,
    },
    Text(String),
}

/// Reads `text` into a tree (`None`: not XML).
pub fn parse(text: &str) -> Option<XNode> {
    let doc = roxmltree::Document::parse(text).ok()?;
    Some(convert(doc.root_element()))
}

fn convert(n: roxmltree::Node) -> XNode {
    let tag = n.tag_name();
    XNode::Elem {
        ns: tag.namespace().unwrap_or("").to_string(),
        name: tag.name().to_string(),
        attrs: n
            .attributes()
            .map(|a| {
                (
                    a.namespace().unwrap_or("").to_string(),
                    a.name().to_string(),
                    a.value().to_string(),
                )
            })
            .collect(),
        children: n
            .children()
            .filter_map(|c| {
                if c.is_element() {
                    Some(convert(c))
                } else if c.is_text() {
                    let t = c.text().unwrap_or("");
                    (!t.trim().is_empty()).then(|| XNode::Text(t.to_string()))
                } else {
                    None
                }
            })
            .collect(),
    }
}

/// The tree as text, each namespace declared where an element or attribute uses it.
pub fn write(n: &XNode) -> String {
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"utf-8\"?>\n");
    write_into(n, &mut out);
    out
}

fn write_into(n: &XNode, out: &mut String) {
    match n {
        XNode::Text(t) => out.push_str(&sources::openadr2b::payload::esc(t)),
        XNode::Elem {
            ns,
            name,
            attrs,
            children,
        } => {
            let tag = if ns.is_empty() {
                name.clone()
            } else {
                format!("e:{name}")
            };
            out.push('<');
            out.push_str(&tag);
            if !ns.is_empty() {
                out.push_str(&format!(
                    " xmlns:e=\"{}\"",
                    sources::openadr2b::payload::esc(ns)
                ));
            }
            for (i, (ans, aname, v)) in attrs.iter().enumerate() {
                let v = sources::openadr2b::payload::esc(v);
                if ans.is_empty() {
                    out.push_str(&format!(" {aname}=\"{v}\""));
                } else {
                    let ans = sources::openadr2b::payload::esc(ans);
                    out.push_str(&format!(" xmlns:a{i}=\"{ans}\" a{i}:{aname}=\"{v}\""));
                }
            }
            if children.is_empty() {
                out.push_str("/>");
                return;
            }
            out.push('>');
            for c in children {
                write_into(c, out);
            }
            out.push_str("</");
            out.push_str(&tag);
            out.push('>');
        }
    }
}

/// Values at the edges of what a 2.0b reader takes.
const EDGES: &[&str] = &[
    "PT-5M",
    "P1000000Y",
    "PT0S",
    "P99999999999999999999D",
    "PT1.5S",
    "P",
    "PT",
    "-PT1H",
    "P1Y2M3W4DT5H6M7.5S",
    "9999-12-31T23:59:59Z",
    "0000-01-01T00:00:00Z",
    "2024-02-30T25:61:61Z",
    "2024-06-03T12:00:00+99:99",
    "2024-06-03T12:00:00.999999999999Z",
    "1e999",
    "-1e999",
    "NaN",
    "inf",
    "-0",
    "-1",
    "0",
    "18446744073709551616",
    "4294967296",
    "true",
    "",
    " ",
    "\u{0}",
    "\u{202e}",
];

/// Raw text that changes how the text reads (inserted without escaping).
const RAW: &[&str] = &[
    "&amp;",
    "&lt;x&gt;",
    "&#0;",
    "&#x110000;",
    "&unknown;",
    "<![CDATA[<a>]]>",
    "<!-- c -->",
    "<?pi x?>",
    "<x",
    "</",
];

/// Every element's local name and namespace in `n`, for renames and moves.
pub fn words(n: &XNode, names: &mut Vec<String>, spaces: &mut Vec<String>) {
    if let XNode::Elem {
        ns, name, children, ..
    } = n
    {
        names.push(name.clone());
        spaces.push(ns.clone());
        for c in children {
            words(c, names, spaces);
        }
    }
}

/// How many nodes `n` holds (itself included).
fn count(n: &XNode) -> usize {
    match n {
        XNode::Text(_) => 1,
        XNode::Elem { children, .. } => 1 + children.iter().map(count).sum::<usize>(),
    }
}

/// The `k`-th node of `n` in document order, and its parent's children with its index
/// there (`None` for the root).
fn nth(n: &mut XNode, k: usize) -> Option<(&mut Vec<XNode>, usize)> {
    let XNode::Elem { children, .. } = n else {
        return None;
    };
    let mut k = k;
    let mut at = None;
    for (i, c) in children.iter().enumerate() {
        let size = count(c);
        if k == 0 {
            at = Some((i, false));
            break;
        }
        if k < size {
            at = Some((i, true));
            break;
        }
        k -= size;
    }
    match at {
        Some((i, false)) => Some((children, i)),
        Some((i, true)) => nth(&mut children[i], k - 1),
        None => None,
    }
}

/// The words a mutant may use: local names and namespaces of every seed.
pub struct Dict {
    pub names: Vec<String>,
    pub spaces: Vec<String>,
}

/// The largest mutant: beyond it a mutation is undone.
const MAX_MUTANT: usize = 8 << 20;

/// One to three structural mutations of `seed`; `other` is grafted from. A mutation
/// that takes the mutant past 8 MiB is undone.
pub fn mutant(rng: &mut Rng, seed: &XNode, other: &XNode, dict: &Dict) -> String {
    let mut t = seed.clone();
    for _ in 0..1 + below(rng, 3) {
        let before = t.clone();
        mutate(rng, &mut t, other, dict);
        if count(&t) > 400_000 || write(&t).len() > MAX_MUTANT {
            t = before;
        }
    }
    write_raw(rng, &t)
}

/// Writes `t`, now and then with raw markup in one text.
fn write_raw(rng: &mut Rng, t: &XNode) -> String {
    let text = write(t);
    if below(rng, 8) != 0 {
        return text;
    }
    // after the opening tag of a random element
    let starts: Vec<usize> = text.match_indices('>').map(|(i, _)| i + 1).collect();
    let at = starts[below(rng, starts.len())];
    let raw = RAW[below(rng, RAW.len())];
    format!("{}{raw}{}", &text[..at], &text[at..])
}

fn mutate(rng: &mut Rng, t: &mut XNode, other: &XNode, dict: &Dict) {
    let size = count(t);
    if size < 2 {
        return;
    }
    let k = 1 + below(rng, size - 1);
    let Some((siblings, i)) = nth(t, k - 1) else {
        return;
    };
    match below(rng, 10) {
        0 | 1 => edge_value(rng, &mut siblings[i]),
        2 => {
            siblings.remove(i);
        }
        3 => {
            if let XNode::Elem { name, .. } = &mut siblings[i] {
                *name = dict.names[below(rng, dict.names.len())].clone();
            }
        }
        4 => {
            if let XNode::Elem { ns, .. } = &mut siblings[i] {
                *ns = match below(rng, 3) {
                    0 => String::new(),
                    1 => "urn:powerplane:not-openadr".into(),
                    _ => dict.spaces[below(rng, dict.spaces.len())].clone(),
                };
            }
        }
        5 => {
            // copied many times, spliced in at once
            let copy = siblings[i].clone();
            // at most about 4 MiB of copies
            let each = write(&copy).len().max(1);
            let n = [2, 10, 1_000, 20_000][below(rng, 4)]
                .min((4 << 20) / each)
                .max(1);
            let tail = siblings.split_off(i);
            siblings.extend(std::iter::repeat_n(copy, n));
            siblings.extend(tail);
        }
        6 => siblings[i] = wrap(rng, &siblings[i], dict),
        7 => {
            let j = below(rng, siblings.len());
            siblings.swap(i, j);
        }
        8 => attribute(rng, &mut siblings[i], dict),
        _ => {
            // an element of another seed grafted here
            let mut o = other.clone();
            let osize = count(&o);
            if osize > 1 {
                if let Some((from, j)) = nth(&mut o, below(rng, osize - 1)) {
                    let g = from[j].clone();
                    siblings.insert(i, g);
                }
            }
        }
    }
}

/// `n` wrapped 2, 30 or 300 deep in elements of one name.
fn wrap(rng: &mut Rng, n: &XNode, dict: &Dict) -> XNode {
    let depth = [2, 30, 300][below(rng, 3)];
    let name = dict.names[below(rng, dict.names.len())].clone();
    let ns = dict.spaces[below(rng, dict.spaces.len())].clone();
    let mut node = n.clone();
    for _ in 0..depth {
        node = XNode::Elem {
            ns: ns.clone(),
            name: name.clone(),
            attrs: Vec::new(),
            children: vec![node],
        };
    }
    node
}

/// An attribute of `n` set to an edge value, removed, or added.
fn attribute(rng: &mut Rng, n: &mut XNode, dict: &Dict) {
    let XNode::Elem { attrs, .. } = n else {
        return;
    };
    match below(rng, 3) {
        0 if !attrs.is_empty() => {
            let a = below(rng, attrs.len());
            attrs[a].2 = EDGES[below(rng, EDGES.len())].to_string();
        }
        1 if !attrs.is_empty() => {
            attrs.remove(below(rng, attrs.len()));
        }
        _ => attrs.push((
            dict.spaces[below(rng, dict.spaces.len())].clone(),
            dict.names[below(rng, dict.names.len())].clone(),
            EDGES[below(rng, EDGES.len())].to_string(),
        )),
    }
}

/// A text (or the first text under an element) replaced by an edge value.
fn edge_value(rng: &mut Rng, n: &mut XNode) {
    let v = EDGES[below(rng, EDGES.len())];
    match n {
        XNode::Text(t) => *t = v.to_string(),
        XNode::Elem { children, .. } => {
            match children.iter_mut().find(|c| matches!(c, XNode::Text(_))) {
                Some(t) => *t = XNode::Text(v.to_string()),
                None => children.push(XNode::Text(v.to_string())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_written_back_reads_as_the_same_tree() {
        let text = r#"<a:x xmlns:a="urn:one" xmlns:b="urn:two" b:k="v &amp; w"><b:y>1 &lt; 2</b:y><z/></a:x>"#;
        let t = parse(text).expect("xml");
        let back = parse(&write(&t)).expect("written back");
        assert_eq!(t, back);
        let mut names = Vec::new();
        let mut spaces = Vec::new();
        words(&t, &mut names, &mut spaces);
        assert_eq!(names, vec!["x", "y", "z"]);
    }

    #[test]
    fn the_nth_node_is_found_in_document_order() {
        let mut t = parse("<r><a><b/></a><c>t</c></r>").expect("xml");
        let name = |n: &XNode| match n {
            XNode::Elem { name, .. } => name.clone(),
            XNode::Text(t) => format!("text {t}"),
        };
        let got: Vec<String> = (0..4)
            .map(|k| {
                let (s, i) = nth(&mut t, k).expect("node");
                name(&s[i])
            })
            .collect();
        assert_eq!(got, vec!["a", "b", "c", "text t"]);
        assert!(nth(&mut t, 4).is_none());
    }
}
