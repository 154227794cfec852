//! Interconnects: bandwidth and latency of one GPU's link, within a node
//! and between nodes.
//!
//! Bandwidths are the vendors' per-direction figures for one GPU (one
//! NIC per GPU between nodes, as on DGX and HPE Cray EX nodes).
//! Latencies are the per-message start-up cost `alpha` of the alpha-beta
//! model, typical orders of magnitude for NCCL/RCCL rather than data-sheet
//! values; both can be overridden (`--intra-gbps`, `--inter-us`, ...).

use serde::Serialize;

/// One link, as the alpha-beta model sees it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Link {
    /// Name used on the command line.
    pub name: &'static str,
    /// Bytes per second in one direction for one GPU.
    pub bandwidth: f64,
    /// Seconds of start-up per message (`alpha`).
    pub latency: f64,
}

/// The known links. Sources: NVIDIA A100 (NVLink 3: 600 GB/s
/// bidirectional) and H100 (NVLink 4: 900 GB/s) data sheets; AMD CDNA 2
/// white paper (MI250X: Infinity Fabric links of 50 GB/s per direction,
/// two between a node's GCD pairs here) and MI300X data sheet (896 GB/s
/// aggregate peer-to-peer); InfiniBand HDR 200 Gb/s and NDR 400 Gb/s per
/// port; HPE Slingshot-11 200 Gb/s per NIC.
pub const LINKS: &[Link] = &[
    Link {
        name: "nvlink3",
        bandwidth: 300e9,
        latency: 5e-6,
    },
    Link {
        name: "nvlink4",
        bandwidth: 450e9,
        latency: 5e-6,
    },
    Link {
        name: "infinity-fabric-mi250x",
        bandwidth: 100e9,
        latency: 5e-6,
    },
    Link {
        name: "infinity-fabric",
        bandwidth: 448e9,
        latency: 5e-6,
    },
    Link {
        name: "ib-hdr",
        bandwidth: 25e9,
        latency: 10e-6,
    },
    Link {
        name: "ib-ndr",
        bandwidth: 50e9,
        latency: 10e-6,
    },
    Link {
        name: "slingshot-11",
        bandwidth: 25e9,
        latency: 10e-6,
    },
];

/// The table's link named `name`, if listed.
pub fn link(name: &str) -> Option<Link> {
    LINKS.iter().find(|l| l.name == name).copied()
}

/// The links a GPU type usually comes with, (within a node, between nodes):
/// A100 nvlink3 + ib-hdr (DGX A100), H100/H200 nvlink4 + ib-ndr (DGX H100),
/// MI250X infinity-fabric-mi250x + slingshot-11 (Frontier, LUMI), MI300X
/// infinity-fabric + ib-ndr. `None` for a CPU: give both.
pub fn default_links(gpu: &str) -> Option<(Link, Link)> {
    let pair = |a, b| Some((link(a)?, link(b)?));
    match gpu {
        "a100-40gb" | "a100-80gb" => pair("nvlink3", "ib-hdr"),
        "h100-80gb" | "h200" => pair("nvlink4", "ib-ndr"),
        "mi250x-gcd" => pair("infinity-fabric-mi250x", "slingshot-11"),
        "mi300x" => pair("infinity-fabric", "ib-ndr"),
        _ => None,
    }
}
