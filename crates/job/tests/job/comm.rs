//! `parallelism.comm`: which transport each backend gets.

use std::ffi::OsStr;

use ferrotron_engine::backend::BackendKind;
use ferrotron_job::comm::{resolve, Transport};
use ferrotron_job::config::CommChoice;
use ferrotron_parallel::comm::nccl::LIBRARY_ENV;

fn message(r: Result<Transport, String>) -> String {
    match r {
        Ok(_) => panic!("accepted"),
        Err(e) => e,
    }
}

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
            assert!(matches!(resolve(choice, kind, lib), Ok(Transport::Mpi)));
        }
    }
}

#[test]
fn nccl_on_a_cpu_backend_needs_the_library_variable() {
    let msg = message(resolve(CommChoice::Nccl, BackendKind::Flex, None));
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
    ));
    assert!(msg.contains(&format!("{LIBRARY_ENV}={path}")), "{msg}");
}

#[test]
fn nccl_on_a_gpu_backend_is_refused_until_device_buffers_are_wired() {
    for kind in [BackendKind::Cuda, BackendKind::Rocm] {
        let msg = message(resolve(CommChoice::Nccl, kind, None));
        assert!(msg.contains("--comm mpi"), "{msg}");
    }
}
