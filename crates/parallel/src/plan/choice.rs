//! One parallel layout the planner can rank, and its label
//! (`dp16-tp4sp-pp2v2-z1-mb1-sel`; with context parallelism
//! `dp8-tp4sp-cp2-pp2v2-z1-mb1-sel`; with the optimizer offloaded
//! `dp8-tp1-pp1-z3-mb1-full-offload`).

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use super::activation::Recompute;
use crate::zero::ZeroStage;

/// A layout: the degrees, the ZeRO stage, the micro-batch and what is
/// recomputed. `dp x cp x tp x pp` is the GPU count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Choice {
    /// Data-parallel degree.
    pub dp: usize,
    /// Tensor-parallel degree (Megatron TP, innermost in the rank order).
    pub tp: usize,
    /// Context-parallel degree: each sequence split over a ring of `cp`
    /// ranks (next to TP in the rank order); the gradients are reduced,
    /// and ZeRO shards, over DP x CP.
    pub cp: usize,
    /// Pipeline-parallel degree (stages).
    pub pp: usize,
    /// Sequence parallelism over the TP group.
    pub sp: bool,
    /// What is sharded over the DP x CP group.
    pub zero: ZeroStage,
    /// Sequences per micro-batch.
    pub micro_batch: usize,
    /// What backward recomputes.
    pub recompute: Recompute,
    /// Model chunks per pipeline stage (1: 1F1B; more: interleaved 1F1B).
    pub interleave: usize,
    /// The ZeRO shard's optimizer state in host memory, updated on the CPU
    /// (`--offload optimizer`; ZeRO 1 to 3, see [`super::offload`]).
    pub offload: bool,
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "dp{}-tp{}{}",
            self.dp,
            self.tp,
            if self.sp { "sp" } else { "" },
        )?;
        if self.cp > 1 {
            write!(f, "-cp{}", self.cp)?;
        }
        write!(f, "-pp{}", self.pp)?;
        if self.interleave > 1 {
            write!(f, "v{}", self.interleave)?;
        }
        write!(
            f,
            "-z{}-mb{}-{}",
            u8::from(self.zero),
            self.micro_batch,
            self.recompute.name()
        )?;
        if self.offload {
            f.write_str("-offload")?;
        }
        Ok(())
    }
}

impl FromStr for Choice {
    type Err = String;

    /// Parses the label [`Choice`] displays.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "'{s}' is not a choice label such as dp16-tp4sp-pp2v2-z1-mb1-sel (see the table)"
            )
        };
        let (s_layout, offload) = match s.strip_suffix("-offload") {
            Some(rest) => (rest, true),
            None => (s, false),
        };
        let parts: Vec<&str> = s_layout.split('-').collect();
        let (dp, tp, cp, pp, z, mb, rc) = match parts[..] {
            [dp, tp, pp, z, mb, rc] => (dp, tp, None, pp, z, mb, rc),
            [dp, tp, cp, pp, z, mb, rc] => (dp, tp, Some(cp), pp, z, mb, rc),
            _ => return Err(bad()),
        };
        let num = |p: &str, prefix: &str| -> Result<usize, String> {
            p.strip_prefix(prefix)
                .and_then(|n| n.parse().ok())
                .filter(|&n| n > 0)
                .ok_or_else(bad)
        };
        let (tp, sp) = match tp.strip_suffix("sp") {
            Some(t) => (t, true),
            None => (tp, false),
        };
        let (pp, interleave) = match pp.split_once('v') {
            Some((p, v)) => (p, v.parse().map_err(|_| bad())?),
            None => (pp, 1),
        };
        let zero = z
            .strip_prefix('z')
            .and_then(|n| n.parse::<u8>().ok())
            .and_then(|n| ZeroStage::try_from(n).ok())
            .ok_or_else(bad)?;
        let recompute = Recompute::ALL
            .into_iter()
            .find(|r| r.name() == rc)
            .ok_or_else(bad)?;
        Ok(Self {
            dp: num(dp, "dp")?,
            tp: num(tp, "tp")?,
            cp: cp.map_or(Ok(1), |cp| {
                num(cp, "cp").and_then(|n| match n {
                    1 => Err(bad()),
                    n => Ok(n),
                })
            })?,
            pp: num(pp, "pp")?,
            sp,
            zero,
            micro_batch: num(mb, "mb")?,
            recompute,
            interleave,
            offload,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_parse_back() {
        let c = Choice {
            dp: 16,
            tp: 4,
            cp: 1,
            pp: 2,
            sp: true,
            zero: ZeroStage::One,
            micro_batch: 2,
            recompute: Recompute::Selective,
            interleave: 2,
            offload: false,
        };
        assert_eq!(c.to_string(), "dp16-tp4sp-pp2v2-z1-mb2-sel");
        assert_eq!(c.to_string().parse::<Choice>().unwrap(), c);
        let plain = "dp8-tp1-pp1-z0-mb4-none".parse::<Choice>().unwrap();
        assert_eq!(plain.to_string(), "dp8-tp1-pp1-z0-mb4-none");
        assert!("dp8-tp1".parse::<Choice>().is_err());
        let ring = "dp2-tp4sp-cp4-pp2v2-z1-mb1-full".parse::<Choice>().unwrap();
        assert_eq!((ring.dp, ring.tp, ring.cp, ring.pp), (2, 4, 4, 2));
        assert_eq!(ring.to_string(), "dp2-tp4sp-cp4-pp2v2-z1-mb1-full");
        // cp1 is written without its part, so only one label names a layout.
        assert!("dp8-tp1-cp1-pp1-z0-mb4-none".parse::<Choice>().is_err());
        assert!("dp8-tp1-pp1-z5-mb4-none".parse::<Choice>().is_err());
        let offloaded = "dp8-tp1-pp1-z3-mb1-full-offload".parse::<Choice>().unwrap();
        assert!(offloaded.offload && offloaded.zero == ZeroStage::Three);
        assert_eq!(offloaded.to_string(), "dp8-tp1-pp1-z3-mb1-full-offload");
    }
}
