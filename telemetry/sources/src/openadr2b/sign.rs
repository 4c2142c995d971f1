//! XML signatures of the VEN's payloads (`[demand_response.openadr2b] xml_signature`):
//! OpenADR 2.0b's message-level security, a detached XML-DSig signature beside the
//! `oadrSignedObject` in the `oadrPayload`.
//!
//! Two references, each digested with SHA-256 after inclusive canonical XML 1.0
//! (`xml-c14n-20010315`, comments left out): `#oadrSignedObject` (the message) and
//! `#replay` (the `ds:Object` whose `dsp:ReplayProtect` carries the signing time and a
//! nonce, which the VTN checks against replays). `SignedInfo` is canonicalized the
//! same way and signed with the key of the VEN's client certificate (RSA PKCS#1 v1.5
//! SHA-256 or ECDSA P-256 SHA-256, the key's kind decides), and the certificate goes in
//! `KeyInfo`: the VTN checks that it is the one the VEN shows in mutual TLS.
//!
//! The canonical form is computed from the document as parsed ([`c14n`]), not from how
//! it was written. Every element that is canonicalized (the signed object, `SignedInfo`,
//! the `ds:Object`) declares on itself every namespace the envelope declares, so its
//! canonical form is the same whether a verifier reads it in place or copies it out
//! with only the namespaces it uses.

use std::fmt::Write as _;
use std::sync::Arc;

use base64::Engine as _;
use rustls::pki_types::CertificateDer;
use rustls::sign::SigningKey;
use rustls::SignatureScheme;
use sha2::{Digest, Sha256};
use telemetry::Timestamp;

use super::iso::format_datetime;
use super::payload::NAMESPACES;

pub const NS_DS: &str = "http://www.w3.org/2000/09/xmldsig#";
pub const NS_DSP: &str = "http://openadr.org/oadr-2.0b/2012/07/xmldsig-properties";
const C14N: &str = "http://www.w3.org/TR/2001/REC-xml-c14n-20010315";
const SHA256: &str = "http://www.w3.org/2001/04/xmlenc#sha256";

/// Why the VEN cannot sign.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// The certificate or key file cannot be read.
    #[error(transparent)]
    Identity(#[from] crate::tls::TlsError),
    #[error("client_key_file {path}: not a key this VEN signs with: {source}")]
    KeyKind {
        path: String,
        #[source]
        source: rustls::Error,
    },
    #[error("client_key_file {0}: XML signatures take an RSA or an ECDSA P-256 key")]
    Scheme(String),
    #[error("the payload to sign is not XML the VEN wrote: {0}")]
    Payload(String),
    #[error("signing failed: {0}")]
    Sign(#[source] rustls::Error),
}

/// The VEN's signing identity: its client certificate and key.
pub struct Signer {
    key: Arc<dyn SigningKey>,
    scheme: SignatureScheme,
    /// The leaf certificate, base64 (DER), in lines of 64.
    certificate: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("scheme", &self.scheme)
            .finish_non_exhaustive()
    }
}

impl Signer {
    /// The identity in the PEM files of `cert_file` (the chain, leaf first) and
    /// `key_file` (PKCS#8, PKCS#1 or SEC1).
    pub fn from_files(cert_file: &str, key_file: &str) -> Result<Signer, SignError> {
        let (chain, key) = crate::tls::identity_files(cert_file, key_file)?;
        let cert = &chain[0];
        let key = crate::tls::provider()
            .key_provider
            .load_private_key(key)
            .map_err(|source| SignError::KeyKind {
                path: key_file.into(),
                source,
            })?;
        let scheme = [
            SignatureScheme::RSA_PKCS1_SHA256,
            SignatureScheme::ECDSA_NISTP256_SHA256,
        ]
        .into_iter()
        .find(|s| key.choose_scheme(&[*s]).is_some())
        .ok_or_else(|| SignError::Scheme(key_file.into()))?;
        let b64 = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
        let certificate = b64
            .as_bytes()
            .chunks(64)
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect::<Vec<_>>()
            .join("\n");
        Ok(Signer {
            key,
            scheme,
            certificate,
        })
    }

    /// `payload` (an `oadrPayload` with its `oadrSignedObject`, as
    /// [`super::payload`] writes them) with its signature, made at `now` with `nonce`.
    pub fn sign(&self, payload: &str, now: Timestamp, nonce: &str) -> Result<String, SignError> {
        let (head, body) = split(payload)?;
        let object = replay_object(now, nonce);
        let with = |signed_info: &str, value: &str| {
            format!(
                "{head}<ds:Signature {decls}>{signed_info}<ds:SignatureValue>{value}</ds:SignatureValue><ds:KeyInfo><ds:X509Data><ds:X509Certificate>{cert}</ds:X509Certificate></ds:X509Data></ds:KeyInfo>{object}</ds:Signature>{body}",
                decls = declarations(),
                cert = self.certificate
            )
        };
        // the digests, from the document as a verifier parses it
        let method = self.method();
        let draft = with(&signed_info(method, "", ""), "");
        let (signed_object, replay) = {
            let doc = parse(&draft)?;
            (
                digest(&c14n(find_id(&doc, "oadrSignedObject")?)),
                digest(&c14n(find_id(&doc, "replay")?)),
            )
        };
        let info = signed_info(method, &signed_object, &replay);
        let draft = with(&info, "");
        let canonical = {
            let doc = parse(&draft)?;
            let node = doc
                .descendants()
                .find(|n| n.has_tag_name((NS_DS, "SignedInfo")))
                .ok_or_else(|| SignError::Payload("no SignedInfo".into()))?;
            c14n(node)
        };
        let value = self.signature_value(canonical.as_bytes())?;
        Ok(with(&info, &value))
    }

    /// The `SignatureMethod` of the key's scheme.
    fn method(&self) -> &'static str {
        if self.scheme == SignatureScheme::ECDSA_NISTP256_SHA256 {
            "http://www.w3.org/2001/04/xmldsig-more#ecdsa-sha256"
        } else {
            "http://www.w3.org/2001/04/xmldsig-more#rsa-sha256"
        }
    }

    /// The signature of `message`, base64: PKCS#1 v1.5, or ECDSA's r and s of 32 bytes
    /// each (XML-DSig's form, not ASN.1).
    fn signature_value(&self, message: &[u8]) -> Result<String, SignError> {
        let signer = self
            .key
            .choose_scheme(&[self.scheme])
            .ok_or_else(|| SignError::Payload("the key's scheme went away".into()))?;
        let raw = signer.sign(message).map_err(SignError::Sign)?;
        let raw = if self.scheme == SignatureScheme::ECDSA_NISTP256_SHA256 {
            ecdsa_fixed(&raw, 32)
                .ok_or_else(|| SignError::Payload("a malformed ECDSA signature".into()))?
        } else {
            raw
        };
        Ok(base64::engine::general_purpose::STANDARD.encode(raw))
    }
}

/// Every namespace the envelope declares, and `ds`, as attributes.
fn declarations() -> String {
    let mut out = format!("xmlns:ds=\"{NS_DS}\"");
    for (prefix, uri) in NAMESPACES {
        let _ = write!(out, " xmlns:{prefix}=\"{uri}\"");
    }
    out
}

fn signed_info(method: &str, signed_object: &str, replay: &str) -> String {
    let reference = |uri: &str, digest: &str| {
        format!(
            "<ds:Reference URI=\"#{uri}\"><ds:Transforms><ds:Transform Algorithm=\"{C14N}\"></ds:Transform></ds:Transforms><ds:DigestMethod Algorithm=\"{SHA256}\"></ds:DigestMethod><ds:DigestValue>{digest}</ds:DigestValue></ds:Reference>"
        )
    };
    format!(
        "<ds:SignedInfo {decls}><ds:CanonicalizationMethod Algorithm=\"{C14N}\"></ds:CanonicalizationMethod><ds:SignatureMethod Algorithm=\"{method}\"></ds:SignatureMethod>{r1}{r2}</ds:SignedInfo>",
        decls = declarations(),
        r1 = reference("oadrSignedObject", signed_object),
        r2 = reference("replay", replay),
    )
}

fn replay_object(now: Timestamp, nonce: &str) -> String {
    format!(
        "<ds:Object {decls} Id=\"replay\"><ds:SignatureProperties><ds:SignatureProperty Id=\"replay-protect\" Target=\"#oadrSignedObject\"><dsp:ReplayProtect xmlns:dsp=\"{NS_DSP}\"><dsp:timestamp>{t}</dsp:timestamp><dsp:nonce>{n}</dsp:nonce></dsp:ReplayProtect></ds:SignatureProperty></ds:SignatureProperties></ds:Object>",
        decls = declarations(),
        t = format_datetime(now),
        n = super::payload::esc(nonce),
    )
}

/// The payload up to its signed object, and from it on.
fn split(payload: &str) -> Result<(&str, &str), SignError> {
    let at = payload
        .find("<oadr:oadrSignedObject")
        .ok_or_else(|| SignError::Payload("no oadr:oadrSignedObject".into()))?;
    Ok(payload.split_at(at))
}

fn parse(xml: &str) -> Result<roxmltree::Document<'_>, SignError> {
    roxmltree::Document::parse(xml).map_err(|e| SignError::Payload(e.to_string()))
}

/// The element whose `Id` attribute (in any namespace) is `id`.
fn find_id<'a, 'i>(
    doc: &'a roxmltree::Document<'i>,
    id: &str,
) -> Result<roxmltree::Node<'a, 'i>, SignError> {
    doc.descendants()
        .find(|n| n.is_element() && n.attributes().any(|a| a.name() == "Id" && a.value() == id))
        .ok_or_else(|| SignError::Payload(format!("no element with Id {id}")))
}

fn digest(canonical: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(Sha256::digest(canonical.as_bytes()))
}

/// Inclusive canonical XML 1.0 without comments of the subtree at `node` (an element):
/// on it, every namespace in scope; below it, those that change; attributes sorted by
/// namespace and name; text and attribute values escaped as the recommendation says;
/// every element with its end tag.
pub fn c14n(node: roxmltree::Node<'_, '_>) -> String {
    let mut out = String::new();
    element(&mut out, node, &[]);
    out
}

type Scope<'a> = Vec<(&'a str, &'a str)>;

fn element<'a>(out: &mut String, node: roxmltree::Node<'a, '_>, parent: &[(&'a str, &'a str)]) {
    let qname = qualified(node, node.tag_name().namespace(), node.tag_name().name());
    let _ = write!(out, "<{qname}");
    let mut scope: Scope<'a> = node
        .namespaces()
        .filter(|ns| ns.name() != Some("xml"))
        .map(|ns| (ns.name().unwrap_or(""), ns.uri()))
        .collect();
    scope.sort_unstable();
    scope.dedup_by(|a, b| a.0 == b.0);
    for &(prefix, uri) in &scope {
        if parent.contains(&(prefix, uri))
            || (prefix.is_empty() && uri.is_empty() && parent.is_empty())
        {
            continue;
        }
        if prefix.is_empty() {
            let _ = write!(out, " xmlns=\"{}\"", attribute_text(uri));
        } else {
            let _ = write!(out, " xmlns:{prefix}=\"{}\"", attribute_text(uri));
        }
    }
    let mut attributes: Vec<_> = node.attributes().collect();
    attributes.sort_by(|a, b| {
        (a.namespace().unwrap_or(""), a.name()).cmp(&(b.namespace().unwrap_or(""), b.name()))
    });
    for a in attributes {
        let name = qualified(node, a.namespace(), a.name());
        let _ = write!(out, " {name}=\"{}\"", attribute_text(a.value()));
    }
    out.push('>');
    for child in node.children() {
        if child.is_element() {
            element(out, child, &scope);
        } else if child.is_text() {
            out.push_str(&text(child.text().unwrap_or("")));
        }
    }
    let _ = write!(out, "</{qname}>");
}

fn qualified(node: roxmltree::Node<'_, '_>, ns: Option<&str>, local: &str) -> String {
    match ns.and_then(|uri| node.lookup_prefix(uri)) {
        Some(prefix) if !prefix.is_empty() => format!("{prefix}:{local}"),
        _ => local.to_string(),
    }
}

fn text(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\r', "&#xD;")
}

fn attribute_text(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('"', "&quot;")
        .replace('\t', "&#x9;")
        .replace('\n', "&#xA;")
        .replace('\r', "&#xD;")
}

/// An ASN.1 ECDSA signature (a SEQUENCE of the INTEGERs r and s) as r and s of `len`
/// bytes each.
fn ecdsa_fixed(der: &[u8], len: usize) -> Option<Vec<u8>> {
    let (body, rest) = tlv(der, 0x30)?;
    if !rest.is_empty() {
        return None;
    }
    let (r, rest) = tlv(body, 0x02)?;
    let (s, rest) = tlv(rest, 0x02)?;
    if !rest.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(2 * len);
    for int in [r, s] {
        let int = match int {
            [0, rest @ ..] => rest,
            i => i,
        };
        if int.len() > len {
            return None;
        }
        out.extend(std::iter::repeat_n(0u8, len - int.len()));
        out.extend_from_slice(int);
    }
    Some(out)
}

/// One DER element of `tag` (short or long length form): its content and what follows.
fn tlv(der: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&t, rest) = der.split_first()?;
    if t != tag {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 2 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| rest.split_at(len))
}

/// Why a VTN's message is not taken as signed by the VTN the VEN trusts.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VerifyError {
    #[error("the message is not signed")]
    Unsigned,
    #[error("the signature is malformed: {0}")]
    Malformed(String),
    #[error("the signature uses {0}, which this VEN does not check")]
    Unsupported(String),
    #[error("the signature does not cover the oadrSignedObject")]
    NotCovering,
    #[error("the digest of {0} does not match: the message changed after it was signed")]
    Digest(String),
    #[error("the message is signed by another certificate (SHA-256 {0})")]
    Certificate(String),
    #[error("the signature does not verify with the signing certificate")]
    Signature,
}

/// Checks a VTN's message: a `ds:Signature` beside its `oadrSignedObject` whose
/// references (one of them the signed object) digest to what they say after inclusive
/// canonical XML 1.0, whose certificate is the one pinned (`pinned`, its SHA-256), and
/// whose signature over `SignedInfo` verifies with it (RSA PKCS#1 v1.5 SHA-256 or ECDSA
/// P-256 SHA-256).
pub fn verify(body: &str, pinned: &[u8; 32]) -> Result<(), VerifyError> {
    let malformed = |what: &str| VerifyError::Malformed(what.to_string());
    let doc = roxmltree::Document::parse(body).map_err(|e| malformed(&e.to_string()))?;
    let signature = ds(doc.root_element(), "Signature").ok_or(VerifyError::Unsigned)?;
    let info = ds(signature, "SignedInfo").ok_or_else(|| malformed("no SignedInfo"))?;
    let algorithm = |n: Option<roxmltree::Node<'_, '_>>, what: &str| {
        n.and_then(|n| n.attribute("Algorithm"))
            .map(str::to_string)
            .ok_or_else(|| malformed(what))
    };
    let c14n_method = algorithm(
        ds(info, "CanonicalizationMethod"),
        "no CanonicalizationMethod",
    )?;
    if c14n_method != C14N {
        return Err(VerifyError::Unsupported(c14n_method));
    }
    let method = algorithm(ds(info, "SignatureMethod"), "no SignatureMethod")?;
    let ecdsa = match method.as_str() {
        "http://www.w3.org/2001/04/xmldsig-more#rsa-sha256" => false,
        "http://www.w3.org/2001/04/xmldsig-more#ecdsa-sha256" => true,
        _ => return Err(VerifyError::Unsupported(method)),
    };
    check_references(&doc, info)?;
    let b64 = |n: Option<roxmltree::Node<'_, '_>>, what: &str| {
        let text: String = n
            .and_then(|n| n.text())
            .unwrap_or("")
            .split_whitespace()
            .collect();
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|_| malformed(what))
    };
    let cert = b64(
        signature
            .descendants()
            .find(|n| n.has_tag_name((NS_DS, "X509Certificate"))),
        "no X509Certificate",
    )?;
    let fingerprint: [u8; 32] = Sha256::digest(&cert).into();
    if &fingerprint != pinned {
        return Err(VerifyError::Certificate(hex(&fingerprint)));
    }
    let value = b64(ds(signature, "SignatureValue"), "no SignatureValue")?;
    let der = CertificateDer::from(cert);
    let leaf = webpki::EndEntityCert::try_from(&der).map_err(|e| malformed(&e.to_string()))?;
    let message = c14n(info);
    let ok = if ecdsa {
        let asn1 = ecdsa_asn1(&value).ok_or(VerifyError::Signature)?;
        leaf.verify_signature(webpki::ring::ECDSA_P256_SHA256, message.as_bytes(), &asn1)
    } else {
        leaf.verify_signature(
            webpki::ring::RSA_PKCS1_2048_8192_SHA256,
            message.as_bytes(),
            &value,
        )
    };
    ok.map_err(|_| VerifyError::Signature)
}

/// Every reference of `info`: a `#id` within the message, canonicalized (inclusive
/// canonical XML 1.0, the only transform taken) and digested with SHA-256 to what it
/// says; one of them the `oadrSignedObject`.
fn check_references(
    doc: &roxmltree::Document<'_>,
    info: roxmltree::Node<'_, '_>,
) -> Result<(), VerifyError> {
    let malformed = |what: &str| VerifyError::Malformed(what.to_string());
    let algorithm = |n: Option<roxmltree::Node<'_, '_>>, what: &str| {
        n.and_then(|n| n.attribute("Algorithm"))
            .map(str::to_string)
            .ok_or_else(|| malformed(what))
    };
    let mut covers = false;
    for reference in info
        .children()
        .filter(|c| c.has_tag_name((NS_DS, "Reference")))
    {
        let uri = reference.attribute("URI").unwrap_or("");
        let id = uri
            .strip_prefix('#')
            .ok_or_else(|| VerifyError::Unsupported(format!("the reference {uri:?}")))?;
        if let Some(t) = ds(reference, "Transforms") {
            for a in t.children().filter_map(|t| t.attribute("Algorithm")) {
                if a != C14N {
                    return Err(VerifyError::Unsupported(a.to_string()));
                }
            }
        }
        let digest_method = algorithm(ds(reference, "DigestMethod"), "no DigestMethod")?;
        if digest_method != SHA256 {
            return Err(VerifyError::Unsupported(digest_method));
        }
        let told: String = ds(reference, "DigestValue")
            .and_then(|d| d.text())
            .unwrap_or("")
            .split_whitespace()
            .collect();
        let target = find_id(doc, id).map_err(|_| malformed(&format!("no element {uri}")))?;
        if digest(&c14n(target)) != told {
            return Err(VerifyError::Digest(uri.to_string()));
        }
        covers |= target.has_tag_name((super::payload::NS_OADR, "oadrSignedObject"));
    }
    if !covers {
        return Err(VerifyError::NotCovering);
    }
    Ok(())
}

/// The `ds:` child of `n` named `name`.
fn ds<'a, 'i>(n: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    n.children().find(|c| c.has_tag_name((NS_DS, name)))
}

fn hex(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// ECDSA's r and s (XML-DSig's form) as the ASN.1 SEQUENCE of two INTEGERs.
fn ecdsa_asn1(fixed: &[u8]) -> Option<Vec<u8>> {
    if fixed.is_empty() || !fixed.len().is_multiple_of(2) || fixed.len() > 132 {
        return None;
    }
    let int = |b: &[u8]| {
        let b = &b[b.iter().position(|&x| x != 0).unwrap_or(b.len() - 1)..];
        let mut out = vec![0x02];
        let pad = b[0] & 0x80 != 0;
        out.push((b.len() + usize::from(pad)) as u8);
        if pad {
            out.push(0);
        }
        out.extend_from_slice(b);
        out
    };
    let (r, s) = fixed.split_at(fixed.len() / 2);
    let body = [int(r), int(s)].concat();
    let mut out = vec![0x30];
    if body.len() >= 0x80 {
        out.push(0x81);
    }
    out.push(body.len() as u8);
    out.extend(body);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The canonical form as the recommendation gives it: every namespace in scope on
    /// the apex, a new one where it is declared, namespaces by prefix, attributes
    /// unqualified first by name then by namespace URI, quotes kept in text and `"`
    /// escaped in attributes, empty elements with end tags.
    #[test]
    fn canonical_xml_of_a_subtree_follows_the_recommendation() {
        let doc = roxmltree::Document::parse(
            "<?xml version=\"1.0\"?>\n<a:root xmlns:b=\"urn:b\" xmlns:a=\"urn:a\"><a:child z=\"1\" b:y=\"2\" a='&quot;q&apos;' ><b:leaf xmlns:c=\"urn:c\" c:k=\"v\">x &amp; \"y\" 'z' &gt;</b:leaf><empty/></a:child></a:root>",
        )
        .expect("xml");
        let child = doc
            .descendants()
            .find(|n| n.has_tag_name(("urn:a", "child")))
            .expect("child");
        assert_eq!(
            c14n(child),
            "<a:child xmlns:a=\"urn:a\" xmlns:b=\"urn:b\" a=\"&quot;q'\" z=\"1\" b:y=\"2\"><b:leaf xmlns:c=\"urn:c\" c:k=\"v\">x &amp; \"y\" 'z' &gt;</b:leaf><empty></empty></a:child>"
        );
    }

    #[test]
    fn an_ecdsa_signature_becomes_r_and_s_of_fixed_length() {
        // r with a leading zero (its high bit set), s shorter than 32 bytes
        let mut der = vec![0x30, 0x00, 0x02, 33, 0x00];
        der.extend([0x80; 32]);
        der.extend([0x02, 2, 0x01, 0x02]);
        der[1] = (der.len() - 2) as u8;
        let fixed = ecdsa_fixed(&der, 32).expect("fixed");
        assert_eq!(fixed.len(), 64);
        assert_eq!(&fixed[..32], &[0x80; 32]);
        assert_eq!(&fixed[32..62], &[0; 30]);
        assert_eq!(&fixed[62..], &[1, 2]);
        assert!(ecdsa_fixed(&der[..10], 32).is_none(), "truncated");
        // and back: the same INTEGERs, minimal, a zero before a high bit
        assert_eq!(ecdsa_asn1(&fixed).expect("asn1"), der);
        assert!(ecdsa_asn1(&fixed[..63]).is_none(), "odd length");
    }
}
