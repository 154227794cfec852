//! Every rank's [`PhaseMemory`] gathered over the world, so that rank 0
//! writes one `metrics.jsonl` line per rank.
//!
//! The communicator moves `f32`, which holds integers exactly only up to
//! 2^24; each count crosses as four 16-bit words (an absent one as four
//! `0xFFFF` words, a value no memory reading reaches).
//!
//! [`release_free_heap`] runs before a checkpoint save's window opens: the
//! step before it frees its activations and gradients, which glibc's
//! allocator keeps resident, and the save's peak would count them.

use ferrotron_engine::metrics::{MemoryPhase, PhaseMemory};

use crate::comm::{CommError, Communicator};

/// `f32` words per count.
const WORDS: usize = 4;
/// Counts per record: step, peak and start RSS, device in use and reserved.
const COUNTS: usize = 5;
/// An absent count's words.
const ABSENT: u64 = u64::MAX;

/// Returns the heap's free pages to the system (glibc's `malloc_trim`),
/// so that the process's resident memory is what it uses, not what the
/// step before freed and the allocator kept; nothing on other C
/// libraries.
pub(crate) fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: glibc's malloc_trim only gives free pages back to the
        // system; it takes the allocator's locks itself.
        unsafe {
            malloc_trim(0);
        }
    }
}

/// Every world rank's record of `mine` (collective: every rank calls it for
/// the same phase), in rank order.
pub fn gather_phase_memory(
    world: &dyn Communicator,
    mine: &PhaseMemory,
) -> Result<Vec<PhaseMemory>, CommError> {
    let send = encode(mine);
    let mut recv = vec![0.0f32; send.len() * world.world_size()];
    world.all_gather(&send, &mut recv)?;
    Ok(recv
        .chunks_exact(send.len())
        .enumerate()
        .map(|(rank, words)| decode(mine.memory_phase, rank, words))
        .collect())
}

/// A record's counts as `COUNTS x WORDS` words.
fn encode(m: &PhaseMemory) -> Vec<f32> {
    let counts = [
        Some(m.step as u64),
        m.peak_rss_bytes,
        m.start_rss_bytes,
        m.device_bytes_in_use,
        m.device_bytes_reserved,
    ];
    counts
        .iter()
        .flat_map(|c| {
            let v = c.unwrap_or(ABSENT);
            (0..WORDS).map(move |i| ((v >> (16 * i)) & 0xFFFF) as f32)
        })
        .collect()
}

/// The record of `rank` from its words.
fn decode(phase: MemoryPhase, rank: usize, words: &[f32]) -> PhaseMemory {
    let count = |k: usize| {
        let v = (0..WORDS).fold(0u64, |v, i| v | ((words[k * WORDS + i] as u64) << (16 * i)));
        (v != ABSENT).then_some(v)
    };
    debug_assert_eq!(words.len(), COUNTS * WORDS);
    PhaseMemory {
        memory_phase: phase,
        rank,
        step: count(0).unwrap_or(0) as usize,
        peak_rss_bytes: count(1),
        start_rss_bytes: count(2),
        device_bytes_in_use: count(3),
        device_bytes_reserved: count(4),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_above_two_to_the_24_cross_exactly_and_absent_stays_absent() {
        let m = PhaseMemory {
            memory_phase: MemoryPhase::CheckpointLoad,
            rank: 0,
            step: 12,
            peak_rss_bytes: Some((1 << 40) + 12_345_677),
            start_rss_bytes: Some(u64::MAX - 1),
            device_bytes_in_use: None,
            device_bytes_reserved: Some(0),
        };
        let words = encode(&m);
        assert_eq!(words.len(), COUNTS * WORDS);
        assert!(words.iter().all(|&w| w == w.trunc() && w < 65_536.0));
        assert_eq!(decode(MemoryPhase::CheckpointLoad, 0, &words), m);
        let other = decode(MemoryPhase::CheckpointLoad, 3, &words);
        assert_eq!(other.rank, 3);
    }
}
