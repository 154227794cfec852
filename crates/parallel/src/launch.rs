//! How a process learns its place in the job: rank, world size and local
//! rank, from the variables its launcher sets.
//!
//! Checked in this order (the first launcher whose rank variable is set
//! wins, so `mpirun` inside a SLURM allocation is read as Open MPI):
//!
//! | launcher | rank | world size | local rank |
//! |---|---|---|---|
//! | Open MPI `mpirun` | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` |
//! | torchrun | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` |
//! | SLURM `srun` | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` |
//!
//! With none set the process is a one-rank job.

use std::collections::HashMap;

/// Which launcher started the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// No launcher variables: a plain one-process run.
    None,
    /// Open MPI's `mpirun`/`mpiexec`.
    OpenMpi,
    /// PyTorch's `torchrun` (or anything setting `RANK`/`WORLD_SIZE`).
    Torchrun,
    /// SLURM's `srun`.
    Slurm,
}

impl std::fmt::Display for Launcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Launcher::None => "none",
            Launcher::OpenMpi => "Open MPI",
            Launcher::Torchrun => "torchrun",
            Launcher::Slurm => "SLURM",
        })
    }
}

/// A process's place in the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchInfo {
    /// Who set the variables.
    pub launcher: Launcher,
    /// Global rank, `0..world_size`.
    pub rank: usize,
    /// Number of processes in the job.
    pub world_size: usize,
    /// Rank among the processes on this node (picks the local device).
    pub local_rank: usize,
}

impl LaunchInfo {
    /// A one-process job.
    pub const SINGLE: LaunchInfo = LaunchInfo {
        launcher: Launcher::None,
        rank: 0,
        world_size: 1,
        local_rank: 0,
    };

    /// Whether this process writes the run directory and prints progress.
    pub fn is_lead(&self) -> bool {
        self.rank == 0
    }
}

/// A launcher variable that is missing, not a number, or out of range.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The rank variable is set but a companion variable is not.
    #[error("{launcher}: {rank_var} is set but {missing} is not")]
    Missing {
        /// The launcher.
        launcher: Launcher,
        /// Its rank variable.
        rank_var: &'static str,
        /// The unset variable.
        missing: &'static str,
    },
    /// A variable is not a non-negative integer.
    #[error("{name}='{value}' is not a non-negative integer")]
    NotANumber {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
    },
    /// rank >= world size, or world size 0.
    #[error("{launcher}: rank {rank} is outside 0..{world_size}")]
    OutOfRange {
        /// The launcher.
        launcher: Launcher,
        /// The rank read.
        rank: usize,
        /// The world size read.
        world_size: usize,
    },
}

const LAUNCHERS: [(Launcher, [&str; 3]); 3] = [
    (
        Launcher::OpenMpi,
        [
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
        ],
    ),
    (Launcher::Torchrun, ["RANK", "WORLD_SIZE", "LOCAL_RANK"]),
    (
        Launcher::Slurm,
        ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"],
    ),
];

/// Reads the launch variables from `vars` (unit tests pass a map).
pub fn detect_from(vars: &HashMap<String, String>) -> Result<LaunchInfo, LaunchError> {
    let num = |name: &'static str| -> Result<Option<usize>, LaunchError> {
        match vars.get(name) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| LaunchError::NotANumber {
                    name,
                    value: v.clone(),
                }),
        }
    };
    for (launcher, [rank_var, size_var, local_var]) in LAUNCHERS {
        let Some(rank) = num(rank_var)? else {
            continue;
        };
        let world_size = num(size_var)?.ok_or(LaunchError::Missing {
            launcher,
            rank_var,
            missing: size_var,
        })?;
        // A missing local rank is read as a one-process-per-node layout.
        let local_rank = num(local_var)?.unwrap_or(0);
        if rank >= world_size {
            return Err(LaunchError::OutOfRange {
                launcher,
                rank,
                world_size,
            });
        }
        return Ok(LaunchInfo {
            launcher,
            rank,
            world_size,
            local_rank,
        });
    }
    Ok(LaunchInfo::SINGLE)
}

/// Reads the launch variables from this process's environment.
pub fn detect() -> Result<LaunchInfo, LaunchError> {
    detect_from(&std::env::vars().collect())
}

/// Each launcher's variable for the processes of the job on one node.
const LOCAL_SIZES: [(Launcher, &str); 3] = [
    (Launcher::OpenMpi, "OMPI_COMM_WORLD_LOCAL_SIZE"),
    (Launcher::Torchrun, "LOCAL_WORLD_SIZE"),
    (Launcher::Slurm, "SLURM_NTASKS_PER_NODE"),
];

/// Processes of the job on this process's node, read from `vars` (unit
/// tests pass a map): `launcher`'s local-size variable, or 1 when it is
/// unset or not a positive integer (SLURM sets its variable only under
/// `--ntasks-per-node`).
pub fn ranks_on_node_from(launcher: Launcher, vars: &HashMap<String, String>) -> usize {
    LOCAL_SIZES
        .iter()
        .find(|(l, _)| *l == launcher)
        .and_then(|(_, name)| vars.get(*name)?.trim().parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(1)
}

/// [`ranks_on_node_from`] this process's environment.
pub fn ranks_on_node(launcher: Launcher) -> usize {
    ranks_on_node_from(launcher, &std::env::vars().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn no_launcher_variables_is_a_single_rank_job() {
        assert_eq!(detect_from(&vars(&[])).unwrap(), LaunchInfo::SINGLE);
    }

    #[test]
    fn open_mpi_slurm_and_torchrun_variables_are_read() {
        let ompi = vars(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ]);
        let want = |launcher, rank, world_size, local_rank| LaunchInfo {
            launcher,
            rank,
            world_size,
            local_rank,
        };
        assert_eq!(
            detect_from(&ompi).unwrap(),
            want(Launcher::OpenMpi, 3, 8, 1)
        );
        let slurm = vars(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "1"),
        ]);
        assert_eq!(
            detect_from(&slurm).unwrap(),
            want(Launcher::Slurm, 5, 16, 1)
        );
        let torch = vars(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")]);
        assert_eq!(
            detect_from(&torch).unwrap(),
            want(Launcher::Torchrun, 0, 2, 0)
        );
    }

    #[test]
    fn mpirun_inside_a_slurm_allocation_is_read_as_open_mpi() {
        let both = vars(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
        ]);
        let info = detect_from(&both).unwrap();
        assert_eq!(info.launcher, Launcher::OpenMpi);
        assert_eq!((info.rank, info.world_size, info.local_rank), (1, 2, 0));
    }

    #[test]
    fn bad_launcher_variables_are_errors_naming_the_variable() {
        let e = detect_from(&vars(&[("RANK", "1")])).unwrap_err();
        assert!(e.to_string().contains("WORLD_SIZE"), "{e}");
        let e = detect_from(&vars(&[("SLURM_PROCID", "x"), ("SLURM_NTASKS", "2")])).unwrap_err();
        assert!(e.to_string().contains("SLURM_PROCID='x'"), "{e}");
        let e = detect_from(&vars(&[("RANK", "2"), ("WORLD_SIZE", "2")])).unwrap_err();
        assert!(e.to_string().contains("rank 2 is outside 0..2"), "{e}");
    }

    #[test]
    fn ranks_on_a_node_come_from_the_launchers_local_size() {
        let ompi = vars(&[
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("LOCAL_WORLD_SIZE", "8"),
        ]);
        assert_eq!(ranks_on_node_from(Launcher::OpenMpi, &ompi), 4);
        assert_eq!(ranks_on_node_from(Launcher::Torchrun, &ompi), 8);
        assert_eq!(ranks_on_node_from(Launcher::Slurm, &ompi), 1);
        assert_eq!(ranks_on_node_from(Launcher::None, &ompi), 1);
        let odd = vars(&[("SLURM_NTASKS_PER_NODE", "2(x3)")]);
        assert_eq!(ranks_on_node_from(Launcher::Slurm, &odd), 1);
    }
}
