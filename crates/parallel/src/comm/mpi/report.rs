//! The text of a timeout error: who arrived, who did not, who is elsewhere.

use super::op::Position;

/// Describes what rank `me`, stuck at `at`, learned about `peers` (the ranks
/// the operation waits for) after a timeout. `heard[r]` is where rank `r`
/// said it was (`None`: not heard from); it has one entry per rank. Ranks
/// are those of the communicator; `world[r]` is rank `r`'s number in the
/// world, the name used in the text (a group's rank 1 may be world rank 5).
///
/// Returns the world ranks never heard from, ascending, and the detail of
/// the error, e.g. `rank 2 never arrived (ranks 0, 1 did)`.
pub(super) fn describe(
    me: usize,
    at: Position,
    peers: &[usize],
    heard: &[Option<Position>],
    world: &[usize],
) -> (Vec<usize>, String) {
    let mut arrived = vec![world[me]];
    let mut lost = Vec::new();
    let mut parts = Vec::new();
    let mut elsewhere = Vec::new();
    for &p in peers {
        let name = world[p];
        match heard[p] {
            None => lost.push(name),
            Some(pos) if pos == at => arrived.push(name),
            Some((op, n)) => elsewhere.push(format!("rank {name} is in {} #{n}", op.name())),
        }
    }
    arrived.sort_unstable();
    lost.sort_unstable();
    if !lost.is_empty() {
        parts.push(format!("{} never arrived", ranks(&lost)));
    }
    parts.extend(elsewhere);
    let detail = if parts.is_empty() {
        format!(
            "{} all arrived, yet it did not finish (do the buffer lengths differ between ranks?)",
            ranks(&arrived)
        )
    } else {
        format!("{} ({} did)", parts.join("; "), ranks(&arrived))
    };
    (lost, detail)
}

/// `rank 2` or `ranks 0, 1`.
fn ranks(list: &[usize]) -> String {
    let joined = list
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if list.len() == 1 {
        format!("rank {joined}")
    } else {
        format!("ranks {joined}")
    }
}

#[cfg(test)]
mod tests {
    use super::super::op::Op;
    use super::*;

    const AT: Position = (Op::AllReduce, 17);
    const WORLD: [usize; 4] = [0, 1, 2, 3];

    #[test]
    fn names_the_rank_that_never_arrived() {
        let heard = [None, Some(AT), None];
        let (lost, text) = describe(0, AT, &[1, 2], &heard, &WORLD);
        assert_eq!(lost, [2]);
        assert_eq!(text, "rank 2 never arrived (ranks 0, 1 did)");
    }

    #[test]
    fn names_several_lost_ranks_and_a_rank_elsewhere() {
        let heard = [None, None, Some((Op::Barrier, 4)), None];
        let (lost, text) = describe(1, AT, &[0, 2, 3], &heard, &WORLD);
        assert_eq!(lost, [0, 3]);
        assert_eq!(
            text,
            "ranks 0, 3 never arrived; rank 2 is in barrier #4 (rank 1 did)"
        );
    }

    #[test]
    fn says_when_every_rank_arrived() {
        let heard = [Some(AT), None];
        let (lost, text) = describe(1, AT, &[0], &heard, &WORLD);
        assert!(lost.is_empty());
        assert_eq!(
            text,
            "ranks 0, 1 all arrived, yet it did not finish (do the buffer lengths differ between ranks?)"
        );
    }

    #[test]
    fn point_to_point_names_only_the_peer() {
        let heard = [None, None, None];
        let (lost, text) = describe(0, (Op::Recv, 3), &[2], &heard, &WORLD);
        assert_eq!(lost, [2]);
        assert_eq!(text, "rank 2 never arrived (rank 0 did)");
    }

    #[test]
    fn a_group_names_ranks_by_their_world_number() {
        // A data-parallel group of world ranks 1 and 3 (tp 2 x dp 2).
        let heard = [None, None];
        let (lost, text) = describe(0, AT, &[1], &heard, &[1, 3]);
        assert_eq!(lost, [3]);
        assert_eq!(text, "rank 3 never arrived (rank 1 did)");
    }
}
