//! CRC-32C (Castagnoli), the checksum of TFRecord framing.
//!
//! A byte-at-a-time table is plenty: event records are tens of bytes and are
//! written a few times per step at most.

/// Reflected Castagnoli polynomial (0x1EDC6F41 bit-reversed).
const POLY: u32 = 0x82F6_3B78;

/// Added after the rotation by TFRecord's mask (see [`masked_crc32c`]).
const MASK_DELTA: u32 = 0xA282_EAD8;

const TABLE: [u32; 256] = build_table();

const fn build_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
}

/// CRC-32C of `data` (init and final xor 0xFFFFFFFF, reflected), e.g.
/// `crc32c(b"123456789") == 0xE3069283`.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc = TABLE[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
    }
    !crc
}

/// The masked CRC stored in TFRecord files. TensorFlow masks checksums so that
/// a CRC computed over data that itself embeds CRCs stays well distributed:
/// rotate right by 15 bits, then add a constant (wrapping).
pub fn masked_crc32c(data: &[u8]) -> u32 {
    crc32c(data).rotate_right(15).wrapping_add(MASK_DELTA)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        // RFC 3720 (iSCSI) B.4: 32 bytes of zeros and of 0xFF.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xFFu8; 32]), 0x62A8_AB43);
    }

    #[test]
    fn mask_matches_the_definition() {
        // ((0xE3069283 >> 15) | (0xE3069283 << 17)) + 0xa282ead8, computed by hand.
        assert_eq!(masked_crc32c(b"123456789"), 0xC78A_B0E5);
    }
}
