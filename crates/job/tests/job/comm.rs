//! `parallelism.comm`: which transport each backend gets.

use std::ffi::OsStr;

use ferrotron_engine::backend::BackendKind;
use ferrotron_job::comm::{resolve, Transport};
use ferrotron_job::config::CommChoice;
use ferrotron_parallel::comm::nccl::LIBRARY_ENV;
use ferrotron_test_support::skip::skip;

fn message(r: Result<Transport, String>) -> String {
    match r {
        Ok(_) => panic!("accepted"),
        Err(e) => e,
    }
}

/// Without a library that loads, `auto` and `mpi` are MPI everywhere,
/// for a job of data and tensor parallelism or not.
#[test]
fn auto_and_mpi_choose_mpi_on_every_backend() {
    for kind in [
        BackendKind::Flex,
        BackendKind::Ndarray,
        BackendKind::Cuda,
        BackendKind::Rocm,
    ] {
        for choice in [CommChoice::Auto, CommChoice::Mpi] {
            let lib = Some(OsStr::new("/nonexistent/libnccl.so.2"));
            for device_layout in [true, false] {
                assert!(matches!(
                    resolve(choice, kind, lib, device_layout),
                    Ok(Transport::Mpi)
                ));
            }
        }
    }
}

#[test]
fn nccl_on_a_cpu_backend_needs_the_library_variable() {
    let msg = message(resolve(CommChoice::Nccl, BackendKind::Flex, None, true));
    assert!(msg.starts_with("nccl with --backend flex:"), "{msg}");
    assert!(msg.contains(LIBRARY_ENV), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
}

#[test]
fn nccl_with_a_library_that_does_not_open_names_the_file() {
    let path = "/nonexistent/ferrotron/libnccl.so.2";
    let msg = message(resolve(
        CommChoice::Nccl,
        BackendKind::Flex,
        Some(OsStr::new(path)),
        true,
    ));
    assert!(msg.contains(&format!("{LIBRARY_ENV}={path}")), "{msg}");
}

/// On cuda and rocm, `nccl` takes the library that loads (its calls then
/// staged through the GPU's memory) and names the file that does not;
/// `auto` takes it for a job of data and tensor parallelism only, and stays MPI on the CPU
/// backends and wgpu (see `comm::resolve`). The test double stands in
/// for a library that loads (it is built with the `mpi` feature).
#[test]
fn nccl_on_a_gpu_backend_takes_the_library_that_loads() {
    let missing = OsStr::new("/nonexistent/ferrotron/libnccl.so.2");
    for kind in [BackendKind::Cuda, BackendKind::Rocm] {
        let msg = message(resolve(CommChoice::Nccl, kind, Some(missing), true));
        assert!(
            msg.starts_with(&format!("nccl with --backend {kind}:")),
            "{msg}"
        );
        assert!(msg.contains("/nonexistent/ferrotron/libnccl.so.2"), "{msg}");
        assert!(msg.ends_with("or use --comm mpi"), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
    }
    if !cfg!(feature = "mpi") {
        skip("built without the `mpi` feature, which builds the NCCL test double");
        return;
    }
    let double = ferrotron_test_support::nccl_double::library();
    let loads = Some(double.as_os_str());
    for kind in [BackendKind::Cuda, BackendKind::Rocm] {
        for (choice, device_layout) in [
            (CommChoice::Nccl, true),
            (CommChoice::Nccl, false),
            (CommChoice::Auto, true),
        ] {
            let t = resolve(choice, kind, loads, device_layout);
            assert!(
                matches!(t, Ok(Transport::NcclDevice(_, k)) if k == kind),
                "{choice:?} on {kind}, device layout {device_layout}"
            );
        }
        assert!(matches!(
            resolve(CommChoice::Auto, kind, loads, false),
            Ok(Transport::Mpi)
        ));
    }
    for kind in [BackendKind::Flex, BackendKind::Ndarray, BackendKind::Wgpu] {
        assert!(matches!(
            resolve(CommChoice::Auto, kind, loads, true),
            Ok(Transport::Mpi)
        ));
    }
    assert!(matches!(
        resolve(CommChoice::Nccl, BackendKind::Flex, loads, true),
        Ok(Transport::Nccl(_))
    ));
}

/// `Job::on` refuses a communicator whose rank or size is not the job's
/// world's (here one process for a job validated for 2 ranks).
#[test]
fn a_job_refuses_a_communicator_of_another_world() {
    use std::sync::Arc;

    use ferrotron_job::{Job, JobConfig, World};
    use ferrotron_parallel::comm::SingleProcess;

    let mut c = JobConfig::default();
    c.checkpoint.out = Some(std::env::temp_dir().join("ferrotron-job-on-never-written"));
    let world = World {
        world_size: 2,
        ..World::SINGLE
    };
    let valid = c.validate(&world).unwrap_or_else(|e| panic!("{e:?}"));
    let Err(e) = Job::on(valid, Arc::new(SingleProcess)) else {
        panic!("a one-process communicator ran a job of 2 ranks");
    };
    let msg = e.to_string();
    assert!(
        msg.contains("rank 0 of 1") && msg.contains("rank 0 of 2"),
        "{msg}"
    );
}
