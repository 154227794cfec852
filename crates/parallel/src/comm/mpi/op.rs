//! The operations of the communicator, as named in errors and sent in
//! timeout notices.

/// One kind of communicator operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Send,
    Recv,
    Barrier,
    Exchange,
}

/// An operation and its number on this rank: `(Op::AllReduce, 17)` is this
/// rank's 17th all-reduce. Collectives are numbered alike on every rank
/// (every rank makes the same sequence of collective calls).
pub(super) type Position = (Op, u64);

impl Op {
    /// Every operation, in the order of their wire codes.
    pub(super) const ALL: [Op; 8] = [
        Op::AllReduce,
        Op::AllGather,
        Op::ReduceScatter,
        Op::Broadcast,
        Op::Send,
        Op::Recv,
        Op::Barrier,
        Op::Exchange,
    ];

    /// The name used in errors (`all_reduce`, ...).
    pub(super) fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::AllGather => "all_gather",
            Op::ReduceScatter => "reduce_scatter",
            Op::Broadcast => "broadcast",
            Op::Send => "send",
            Op::Recv => "recv",
            Op::Barrier => "barrier",
            Op::Exchange => "exchange",
        }
    }

    /// Index into [`Op::ALL`], sent in timeout notices.
    pub(super) fn code(self) -> u64 {
        self as u64
    }

    /// The operation of a wire code; `None` for an unknown code.
    pub(super) fn from_code(code: u64) -> Option<Op> {
        usize::try_from(code)
            .ok()
            .and_then(|i| Op::ALL.get(i).copied())
    }
}
