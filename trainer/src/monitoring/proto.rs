//! Hand-written protobuf wire encoding of the TensorBoard messages we emit.
//!
//! Field numbers and types, checked against the installed `tensorboard`
//! package's `tensorboard.compat.proto` descriptors:
//!
//! ```text
//! Event         { double wall_time = 1; int64 step = 2;
//!                 oneof what { string file_version = 3; Summary summary = 5; ... } }
//! Summary       { repeated Value value = 1; }
//! Summary.Value { string tag = 1; oneof value { float simple_value = 2; ... } }
//! ```
//!
//! `simple_value` lives in a oneof, so it has presence: it is written even when
//! it is 0.0 (TensorBoard's `data_compat` checks `HasField("simple_value")` and
//! would otherwise drop a zero loss). Plain proto3 scalars (`wall_time`, `step`)
//! are always written too; decoders accept explicit defaults.

const WIRE_VARINT: u32 = 0;
const WIRE_FIXED64: u32 = 1;
const WIRE_LEN: u32 = 2;
const WIRE_FIXED32: u32 = 5;

fn key(buf: &mut Vec<u8>, field: u32, wire: u32) {
    varint(buf, u64::from((field << 3) | wire));
}

fn varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn len_delimited(buf: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    key(buf, field, WIRE_LEN);
    varint(buf, bytes.len() as u64);
    buf.extend_from_slice(bytes);
}

/// Common header of every event: `wall_time` (seconds since the epoch) and `step`.
fn event_header(buf: &mut Vec<u8>, wall_time: f64, step: i64) {
    key(buf, 1, WIRE_FIXED64);
    buf.extend_from_slice(&wall_time.to_le_bytes());
    key(buf, 2, WIRE_VARINT);
    // int64 is encoded as the two's-complement u64 (10 bytes when negative).
    varint(buf, step as u64);
}

/// `Event { wall_time, file_version }`: the first record of every event file;
/// readers use it to recognise the format version.
pub fn file_version_event(wall_time: f64, version: &str) -> Vec<u8> {
    let mut buf = Vec::with_capacity(32);
    key(&mut buf, 1, WIRE_FIXED64);
    buf.extend_from_slice(&wall_time.to_le_bytes());
    len_delimited(&mut buf, 3, version.as_bytes());
    buf
}

/// `Event { wall_time, step, summary: Summary { value: [Value { tag, simple_value }...] } }`.
pub fn scalars_event(wall_time: f64, step: i64, scalars: &[(&str, f32)]) -> Vec<u8> {
    let mut summary = Vec::new();
    let mut value = Vec::new();
    for &(tag, v) in scalars {
        value.clear();
        len_delimited(&mut value, 1, tag.as_bytes());
        key(&mut value, 2, WIRE_FIXED32);
        value.extend_from_slice(&v.to_le_bytes());
        len_delimited(&mut summary, 1, &value);
    }
    let mut buf = Vec::with_capacity(summary.len() + 24);
    event_header(&mut buf, wall_time, step);
    len_delimited(&mut buf, 5, &summary);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints() {
        let enc = |v: u64| {
            let mut b = Vec::new();
            varint(&mut b, v);
            b
        };
        assert_eq!(enc(0), [0]);
        assert_eq!(enc(1), [1]);
        assert_eq!(enc(300), [0xAC, 0x02]);
        assert_eq!(enc(u64::MAX).len(), 10);
        assert_eq!(
            enc(-1i64 as u64),
            [0xFF; 9].iter().copied().chain([1]).collect::<Vec<_>>()
        );
    }

    #[test]
    fn scalar_event_bytes() {
        // Event{wall_time: 1.5, step: 3, summary{value{tag:"a", simple_value: 1.0}}}
        let b = scalars_event(1.5, 3, &[("a", 1.0)]);
        let mut want = vec![0x09];
        want.extend_from_slice(&1.5f64.to_le_bytes());
        want.extend_from_slice(&[0x10, 3, 0x2A, 10, 0x0A, 8, 0x0A, 1, b'a', 0x15]);
        want.extend_from_slice(&1.0f32.to_le_bytes());
        assert_eq!(b, want);
    }
}
