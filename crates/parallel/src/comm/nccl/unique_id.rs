//! `ncclUniqueId` and its bit-exact packing into `f32` words, so that it can
//! travel through a [`Communicator`](crate::comm::Communicator), which moves
//! `f32` buffers.

/// Size of `ncclUniqueId` in bytes (`NCCL_UNIQUE_ID_BYTES`).
pub const UNIQUE_ID_BYTES: usize = 128;

/// Number of `f32` words that carry one unique id (`128 / 4`).
pub const UNIQUE_ID_WORDS: usize = UNIQUE_ID_BYTES / 4;

/// The opaque token that lets the ranks of one job find each other
/// (`ncclUniqueId`: a C struct of 128 `char`s, passed by value to
/// `ncclCommInitRank`). Rank 0 creates it with `ncclGetUniqueId`; every
/// rank must use the same bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UniqueId {
    /// The raw bytes, meaningful only to NCCL / RCCL.
    pub internal: [u8; UNIQUE_ID_BYTES],
}

impl UniqueId {
    /// Packs the 128 bytes into 32 `f32` words, 4 little-endian bytes per
    /// word, by bit pattern (`f32::from_bits`): no arithmetic touches them,
    /// so NaN patterns survive a copy (an MPI broadcast of `MPI_FLOAT` is a
    /// copy on homogeneous machines).
    pub fn to_f32_words(&self) -> [f32; UNIQUE_ID_WORDS] {
        std::array::from_fn(|w| {
            let b = &self.internal[4 * w..4 * w + 4];
            f32::from_bits(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        })
    }

    /// The inverse of [`UniqueId::to_f32_words`] (`f32::to_bits`).
    pub fn from_f32_words(words: &[f32; UNIQUE_ID_WORDS]) -> Self {
        let mut internal = [0u8; UNIQUE_ID_BYTES];
        for (chunk, w) in internal.chunks_exact_mut(4).zip(words) {
            chunk.copy_from_slice(&w.to_bits().to_le_bytes());
        }
        Self { internal }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_id_has_the_128_byte_layout_of_nccl() {
        assert_eq!(std::mem::size_of::<UniqueId>(), 128);
        assert_eq!(std::mem::align_of::<UniqueId>(), 1);
    }

    #[test]
    fn unique_id_f32_packing_round_trips_every_byte_at_every_position() {
        // Id k holds byte (k + i) mod 256 at position i, so across the 256 ids
        // every byte value appears at every position (every lane of every word).
        for k in 0..256usize {
            let id = UniqueId {
                internal: std::array::from_fn(|i| ((k + i) % 256) as u8),
            };
            // Copy the words through a buffer, as a broadcast would.
            let sent: Vec<f32> = id.to_f32_words().to_vec();
            let received: [f32; UNIQUE_ID_WORDS] = sent.as_slice().try_into().unwrap();
            assert_eq!(UniqueId::from_f32_words(&received), id, "id {k}");
        }
    }

    #[test]
    fn unique_id_f32_packing_keeps_nan_and_infinity_bit_patterns() {
        // Signalling and quiet NaNs, both infinities, negative zero, subnormal.
        let patterns: [u32; 8] = [
            0x7f80_0001,
            0xff80_0001,
            0x7fc0_0000,
            0xffff_ffff,
            0x7f80_0000,
            0xff80_0000,
            0x8000_0000,
            0x0000_0001,
        ];
        let mut internal = [0u8; UNIQUE_ID_BYTES];
        for (chunk, p) in internal.chunks_exact_mut(4).zip(patterns.iter().cycle()) {
            chunk.copy_from_slice(&p.to_le_bytes());
        }
        let id = UniqueId { internal };
        let words = id.to_f32_words();
        for (w, p) in words.iter().zip(patterns.iter().cycle()) {
            assert_eq!(w.to_bits(), *p);
        }
        assert_eq!(UniqueId::from_f32_words(&words), id);
    }
}
