//! The unique id and `ncclCommInitRank`'s rendezvous at the id's creator.

use std::sync::atomic::{AtomicU64, Ordering};

use mpi::topology::{Rank, SimpleCommunicator};
use mpi::traits::{Communicator, Destination, Group, Source};

use crate::result::{INTERNAL_ERROR, INVALID_ARGUMENT, INVALID_USAGE};

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    /// Bytes 0..8: [`MAGIC`]; 8..12: the creator's world rank; 12..20: the
    /// creator's serial number of the id; the rest zero.
    pub internal: [u8; 128],
}

/// Marks an id made by this double.
const MAGIC: [u8; 8] = *b"FTNCCLDB";
/// Rendezvous messages use tag `TAG_BASE + serial % TAG_SPAN` on the world
/// communicator (MPI guarantees tags up to 32767).
const TAG_BASE: i32 = 31_000;
const TAG_SPAN: u64 = 1_000;

/// Ids made by this process so far.
static SERIAL: AtomicU64 = AtomicU64::new(0);

/// What an id says: who made it and its number.
struct Token {
    creator: Rank,
    serial: u64,
}

/// A new id made by this process (`ncclGetUniqueId`).
pub fn new_id() -> Result<UniqueId, i32> {
    if !mpi::environment::is_initialized() {
        return Err(INVALID_USAGE);
    }
    let creator = SimpleCommunicator::world().rank();
    let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
    let mut internal = [0u8; 128];
    internal[..8].copy_from_slice(&MAGIC);
    internal[8..12].copy_from_slice(&creator.to_le_bytes());
    internal[12..20].copy_from_slice(&serial.to_le_bytes());
    Ok(UniqueId { internal })
}

/// Reads an id made by [`new_id`] (in any process of the job).
fn token(id: &UniqueId) -> Result<Token, i32> {
    let b = &id.internal;
    if b[..8] != MAGIC {
        return Err(INVALID_USAGE);
    }
    let creator = Rank::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    let serial = u64::from_le_bytes(b[12..20].try_into().expect("8 bytes"));
    Ok(Token { creator, serial })
}

/// The communicator of `nranks` processes that called this with the same
/// `id`, this one as `rank` (`ncclCommInitRank`). Blocks until every member
/// has joined.
pub fn join(nranks: i32, id: &UniqueId, rank: i32) -> Result<SimpleCommunicator, i32> {
    if !mpi::environment::is_initialized() {
        return Err(INVALID_USAGE);
    }
    let Token { creator, serial } = token(id)?;
    let world = SimpleCommunicator::world();
    if nranks < 1 || nranks > world.size() || !(0..nranks).contains(&rank) {
        return Err(INVALID_ARGUMENT);
    }
    if !(0..world.size()).contains(&creator) {
        return Err(INVALID_USAGE);
    }
    let tag = TAG_BASE + (serial % TAG_SPAN) as i32;
    let me = world.rank();
    let table: Vec<Rank> = if me == creator {
        // Collect every other member's (rank, world rank), then tell all.
        let mut table = vec![-1; nranks as usize];
        table[rank as usize] = me;
        for _ in 1..nranks {
            let (hello, _) = world.any_process().receive_vec_with_tag::<Rank>(tag);
            match hello[..] {
                [r, w] if (0..nranks).contains(&r) && table[r as usize] == -1 => {
                    table[r as usize] = w
                }
                _ => return Err(INVALID_USAGE),
            }
        }
        for &w in table.iter().filter(|&&w| w != me) {
            world.process_at_rank(w).send_with_tag(&table[..], tag);
        }
        table
    } else {
        world
            .process_at_rank(creator)
            .send_with_tag(&[rank, me][..], tag);
        world
            .process_at_rank(creator)
            .receive_vec_with_tag::<Rank>(tag)
            .0
    };
    if table.len() != nranks as usize || table[rank as usize] != me {
        return Err(INTERNAL_ERROR);
    }
    let group = world.group().include(&table);
    world
        .split_by_subgroup_with_tag(&group, tag)
        .ok_or(INTERNAL_ERROR)
}
