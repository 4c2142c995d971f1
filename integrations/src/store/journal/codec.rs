//! How a batch is written into the journal file: a version byte, then each op as a
//! tag byte and its fields, each field a little-endian `u32` length and its bytes.

use super::super::{Batch, Op};

/// A journal entry that does not read back as a batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("truncated op")]
    TruncatedOp,
    #[error("truncated field length")]
    TruncatedLength,
    #[error("field of {len} bytes with {left} left")]
    TruncatedField { len: usize, left: usize },
    #[error("name not utf-8: {0}")]
    Name(#[source] std::string::FromUtf8Error),
    #[error("unknown journal entry version {0}")]
    Version(u8),
    #[error("fence epoch is not 8 bytes")]
    Fence,
    #[error("unknown op tag {0}")]
    Tag(u8),
}

const VERSION: u8 = 1;
const PUT: u8 = 1;
const DELETE: u8 = 2;
const APPEND: u8 = 3;
const FENCE: u8 = 4;

pub fn encode(batch: &Batch) -> Vec<u8> {
    let mut out = vec![VERSION];
    let field = |out: &mut Vec<u8>, b: &[u8]| {
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(b);
    };
    for op in &batch.ops {
        match op {
            Op::Put {
                collection,
                key,
                value,
            } => {
                out.push(PUT);
                field(&mut out, collection.as_bytes());
                field(&mut out, key.as_bytes());
                field(&mut out, value);
            }
            Op::Delete { collection, key } => {
                out.push(DELETE);
                field(&mut out, collection.as_bytes());
                field(&mut out, key.as_bytes());
            }
            Op::Append { log, value } => {
                out.push(APPEND);
                field(&mut out, log.as_bytes());
                field(&mut out, value);
            }
            Op::Fence { epoch } => {
                out.push(FENCE);
                field(&mut out, &epoch.to_le_bytes());
            }
        }
    }
    out
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8, DecodeError> {
        let (&b, rest) = self.rest.split_first().ok_or(DecodeError::TruncatedOp)?;
        self.rest = rest;
        Ok(b)
    }

    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        if self.rest.len() < 4 {
            return Err(DecodeError::TruncatedLength);
        }
        let (len, rest) = self.rest.split_at(4);
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        if rest.len() < len {
            return Err(DecodeError::TruncatedField {
                len,
                left: rest.len(),
            });
        }
        let (field, rest) = rest.split_at(len);
        self.rest = rest;
        Ok(field)
    }

    fn text(&mut self) -> Result<String, DecodeError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(DecodeError::Name)
    }
}

pub fn decode(bytes: &[u8]) -> Result<Batch, DecodeError> {
    let mut r = Reader { rest: bytes };
    match r.byte()? {
        VERSION => {}
        v => return Err(DecodeError::Version(v)),
    }
    let mut ops = Vec::new();
    while !r.rest.is_empty() {
        ops.push(match r.byte()? {
            PUT => Op::Put {
                collection: r.text()?,
                key: r.text()?,
                value: r.bytes()?.to_vec(),
            },
            DELETE => Op::Delete {
                collection: r.text()?,
                key: r.text()?,
            },
            APPEND => Op::Append {
                log: r.text()?,
                value: r.bytes()?.to_vec(),
            },
            FENCE => {
                let b: [u8; 8] = r.bytes()?.try_into().map_err(|_| DecodeError::Fence)?;
                Op::Fence {
                    epoch: u64::from_le_bytes(b),
                }
            }
            t => return Err(DecodeError::Tag(t)),
        });
    }
    Ok(Batch { ops })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Batch {
        Batch {
            ops: vec![
                Op::Put {
                    collection: "caps".into(),
                    key: "gpu/a:0".into(),
                    value: b"{\"watts\":200}".to_vec(),
                },
                Op::Delete {
                    collection: "holds".into(),
                    key: "slurm:7".into(),
                },
                Op::Append {
                    log: "audit".into(),
                    value: vec![0, 255, 10],
                },
                Op::Append {
                    log: "ledger".into(),
                    value: Vec::new(),
                },
            ],
        }
    }

    #[test]
    fn a_batch_reads_back_as_written() {
        assert_eq!(decode(&encode(&sample())), Ok(sample()));
        assert_eq!(decode(&encode(&Batch::default())), Ok(Batch::default()));
    }

    #[test]
    fn a_truncated_entry_is_an_error() {
        let bytes = encode(&sample());
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(decode(&[9]).is_err(), "unknown version");
    }
}
