//! The bytes of a task's value in sled: the task's record (`sluice_store::record`, which starts
//! with its format's byte) and, when it is small, the task's payload in the same value, so that
//! a typical submission writes one key fewer. Larger payloads live under their own key and are
//! not rewritten when the task changes state.
//!
//! Layout: `[placement: u8][task length: u32 BE][task record][inline payload JSON]`.

use sluice_store::StoreError;

/// Payloads up to this size are kept inside the task record.
pub const INLINE_PAYLOAD_MAX_BYTES: usize = 8 * 1024;

/// Where a task's payload lives, followed (when inline) by the payload itself: the part of a
/// record that a state change carries over unchanged.
pub const PAYLOAD_INLINE: u8 = 0;
pub const PAYLOAD_SEPARATE: u8 = 1;

const HEADER_BYTES: usize = 5;

pub fn tail_for(payload_json: &[u8]) -> Vec<u8> {
    if payload_json.len() <= INLINE_PAYLOAD_MAX_BYTES {
        let mut tail = Vec::with_capacity(1 + payload_json.len());
        tail.push(PAYLOAD_INLINE);
        tail.extend_from_slice(payload_json);
        tail
    } else {
        vec![PAYLOAD_SEPARATE]
    }
}

pub fn encode(task: &[u8], tail: &[u8]) -> Result<Vec<u8>, StoreError> {
    let (placement, payload) = tail
        .split_first()
        .ok_or_else(|| corrupt("empty record tail"))?;
    let length = u32::try_from(task.len()).map_err(|_| corrupt("task too large"))?;
    let mut out = Vec::with_capacity(HEADER_BYTES + task.len() + payload.len());
    out.push(*placement);
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(task);
    out.extend_from_slice(payload);
    Ok(out)
}

/// A decoded view of a record's bytes.
pub struct Parts<'a> {
    pub task: &'a [u8],
    pub inline_payload: Option<&'a [u8]>,
}

impl Parts<'_> {
    /// The placement byte and the inline payload, as `tail_for` made them.
    pub fn tail(&self) -> Vec<u8> {
        match self.inline_payload {
            Some(payload) => {
                let mut tail = Vec::with_capacity(1 + payload.len());
                tail.push(PAYLOAD_INLINE);
                tail.extend_from_slice(payload);
                tail
            }
            None => vec![PAYLOAD_SEPARATE],
        }
    }
}

pub fn split(bytes: &[u8]) -> Result<Parts<'_>, StoreError> {
    let header: [u8; HEADER_BYTES] = bytes
        .get(..HEADER_BYTES)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| corrupt("short record"))?;
    let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    let task = bytes
        .get(HEADER_BYTES..HEADER_BYTES + length)
        .ok_or_else(|| corrupt("truncated task"))?;
    let payload = &bytes[HEADER_BYTES + length..];
    let inline_payload = match header[0] {
        PAYLOAD_INLINE => Some(payload),
        PAYLOAD_SEPARATE => None,
        other => return Err(corrupt(&format!("unknown payload placement {other}"))),
    };
    Ok(Parts {
        task,
        inline_payload,
    })
}

fn corrupt(detail: &str) -> StoreError {
    StoreError::Corrupt {
        what: "task record",
        detail: detail.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_payloads_ride_inline_and_large_ones_do_not() {
        let small = tail_for(br#"{"eye":"left"}"#);
        let record = encode(br#"{"id":1}"#, &small).unwrap();
        let parts = split(&record).unwrap();
        assert_eq!(parts.task, br#"{"id":1}"#);
        assert_eq!(parts.inline_payload, Some(&br#"{"eye":"left"}"#[..]));
        assert_eq!(parts.tail(), small);

        let large = tail_for(&vec![b' '; INLINE_PAYLOAD_MAX_BYTES + 1]);
        let parts_large = encode(b"{}", &large).unwrap();
        let parts_large = split(&parts_large).unwrap();
        assert_eq!(parts_large.inline_payload, None);
        assert_eq!(parts_large.task, b"{}");

        assert!(split(&[0, 0, 0]).is_err());
        assert!(split(&[0, 0, 0, 0, 9, b'{']).is_err());
        assert!(split(&[7, 0, 0, 0, 0]).is_err());
    }
}
