//! Opening NCCL or RCCL at run time and resolving the C functions this
//! binding calls. RCCL exports NCCL's C API unchanged, so one function
//! table serves both.

use std::ffi::{c_char, c_int, c_void, CStr, OsStr};

use libloading::Library;

use super::error::NcclError;
use super::names::{LIBRARY_ENV, LIBRARY_NAMES};
use super::types::{result_name, NCCL_SUCCESS};
use super::unique_id::UniqueId;

/// `ncclComm_t`: an opaque pointer owned by the library.
pub(super) type RawComm = *mut c_void;
/// `cudaStream_t` / `hipStream_t`: an opaque pointer, null for the default stream.
pub(super) type RawStream = *mut c_void;

/// The NCCL functions this binding calls, with their C signatures from
/// `nccl.h` (enums are C `int`s, `size_t` is `usize`).
pub(super) struct Fns {
    /// `ncclResult_t ncclGetVersion(int* version)`.
    pub get_version: unsafe extern "C" fn(*mut c_int) -> c_int,
    /// `ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId)`.
    pub get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> c_int,
    /// `ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank)`.
    pub comm_init_rank: unsafe extern "C" fn(*mut RawComm, c_int, UniqueId, c_int) -> c_int,
    /// `ncclResult_t ncclCommDestroy(ncclComm_t comm)`.
    pub comm_destroy: unsafe extern "C" fn(RawComm) -> c_int,
    /// `ncclResult_t ncclCommAbort(ncclComm_t comm)`.
    pub comm_abort: unsafe extern "C" fn(RawComm) -> c_int,
    /// `const char* ncclGetErrorString(ncclResult_t result)`.
    pub get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    /// `ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
    /// ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)`.
    pub all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        RawComm,
        RawStream,
    ) -> c_int,
    /// `ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
    /// ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)`.
    pub all_gather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, RawComm, RawStream) -> c_int,
    /// `ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
    /// ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)`.
    pub reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        RawComm,
        RawStream,
    ) -> c_int,
    /// `ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
    /// ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)`.
    pub broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        RawComm,
        RawStream,
    ) -> c_int,
    /// `ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
    /// int peer, ncclComm_t comm, cudaStream_t stream)`.
    pub send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, RawComm, RawStream) -> c_int,
    /// `ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype,
    /// int peer, ncclComm_t comm, cudaStream_t stream)`.
    pub recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, RawComm, RawStream) -> c_int,
    /// `ncclResult_t ncclGroupStart(void)`.
    pub group_start: unsafe extern "C" fn() -> c_int,
    /// `ncclResult_t ncclGroupEnd(void)`.
    pub group_end: unsafe extern "C" fn() -> c_int,
}

/// An opened NCCL or RCCL library and its function table.
///
/// Loading needs neither the library nor CUDA / ROCm at build time; a
/// binary without them runs CPU jobs and gets an [`NcclError`] here only
/// if it asks for NCCL. Share one instance (in an `Arc`) between
/// communicators: it must outlive them.
pub struct NcclLibrary {
    path: String,
    pub(super) fns: Fns,
    // Keeps the code behind `fns` mapped; declared last, dropped last.
    _lib: Library,
}

impl NcclLibrary {
    /// Opens the library named by [`LIBRARY_ENV`] if it is set, otherwise
    /// the first of [`LIBRARY_NAMES`] that opens.
    pub fn load() -> Result<Self, NcclError> {
        Self::load_from(std::env::var_os(LIBRARY_ENV).as_deref())
    }

    /// As [`NcclLibrary::load`], with the value of [`LIBRARY_ENV`] given
    /// explicitly: `Some(path)` opens exactly that file (no fallback to the
    /// default names), `None` searches [`LIBRARY_NAMES`].
    pub fn load_from(explicit: Option<&OsStr>) -> Result<Self, NcclError> {
        match explicit {
            Some(path) => {
                let name = path.to_string_lossy().into_owned();
                match open(path) {
                    Ok(lib) => Self::resolve(lib, name),
                    Err(reason) => Err(NcclError::ExplicitLibrary { path: name, reason }),
                }
            }
            None => open_first(&LIBRARY_NAMES),
        }
    }

    /// The file name or path the library was opened from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The library's version code (`ncclGetVersion`): `major * 10000 +
    /// minor * 100 + patch` for NCCL >= 2.9 (22105 is 2.21.5); RCCL reports
    /// the NCCL version it implements.
    pub fn version(&self) -> Result<i32, NcclError> {
        let mut version: c_int = 0;
        // SAFETY: `version` is a valid, writable `int`.
        let code = unsafe { (self.fns.get_version)(&mut version) };
        self.check("ncclGetVersion", code)?;
        Ok(version)
    }

    /// Creates a new unique id (`ncclGetUniqueId`); called by one rank,
    /// which then shares it with the others.
    pub fn unique_id(&self) -> Result<UniqueId, NcclError> {
        let mut id = UniqueId {
            internal: [0; super::unique_id::UNIQUE_ID_BYTES],
        };
        // SAFETY: `id` is a valid, writable `ncclUniqueId` (same layout).
        let code = unsafe { (self.fns.get_unique_id)(&mut id) };
        self.check("ncclGetUniqueId", code)?;
        Ok(id)
    }

    /// Starts a group (`ncclGroupStart`): the collectives and sends/receives
    /// issued by this thread until [`NcclLibrary::group_end`] are launched
    /// together (needed for a send and a receive between the same two ranks,
    /// which would otherwise deadlock).
    pub fn group_start(&self) -> Result<(), NcclError> {
        // SAFETY: takes no arguments; only updates NCCL's per-thread state.
        let code = unsafe { (self.fns.group_start)() };
        self.check("ncclGroupStart", code)
    }

    /// Ends the group opened by [`NcclLibrary::group_start`] and launches
    /// its operations (`ncclGroupEnd`).
    pub fn group_end(&self) -> Result<(), NcclError> {
        // SAFETY: takes no arguments; NCCL reports a missing group start as an error.
        let code = unsafe { (self.fns.group_end)() };
        self.check("ncclGroupEnd", code)
    }

    /// `Ok` for `ncclSuccess`, otherwise an error naming `op`, the code and
    /// the library's text for it.
    pub(super) fn check(&self, op: &'static str, code: c_int) -> Result<(), NcclError> {
        if code == NCCL_SUCCESS {
            return Ok(());
        }
        // SAFETY: `ncclGetErrorString` accepts any code and returns a static
        // C string (or null, handled below).
        let text = unsafe {
            let ptr = (self.fns.get_error_string)(code);
            if ptr.is_null() {
                String::from("(no error text)")
            } else {
                CStr::from_ptr(ptr).to_string_lossy().into_owned()
            }
        };
        Err(NcclError::Call {
            op,
            code,
            name: result_name(code),
            text,
        })
    }

    /// Resolves every function of [`Fns`] in `lib`, opened from `path`.
    fn resolve(lib: Library, path: String) -> Result<Self, NcclError> {
        /// Copies the function pointer named `symbol` out of `lib`.
        ///
        /// SAFETY (caller): `T` must be the function's exact C signature.
        unsafe fn get<T: Copy>(
            lib: &Library,
            path: &str,
            symbol: &'static str,
        ) -> Result<T, NcclError> {
            lib.get::<T>(symbol.as_bytes())
                .map(|s| *s)
                .map_err(|e| NcclError::MissingSymbol {
                    symbol,
                    library: path.to_string(),
                    reason: e.to_string(),
                })
        }
        // SAFETY: each type in `Fns` is the signature from `nccl.h` (checked
        // against the bindgen output of nccl.h in cudarc 0.19); the pointers stay valid
        // while `_lib` is alive, which `NcclLibrary` guarantees.
        let fns = unsafe {
            Fns {
                get_version: get(&lib, &path, "ncclGetVersion")?,
                get_unique_id: get(&lib, &path, "ncclGetUniqueId")?,
                comm_init_rank: get(&lib, &path, "ncclCommInitRank")?,
                comm_destroy: get(&lib, &path, "ncclCommDestroy")?,
                comm_abort: get(&lib, &path, "ncclCommAbort")?,
                get_error_string: get(&lib, &path, "ncclGetErrorString")?,
                all_reduce: get(&lib, &path, "ncclAllReduce")?,
                all_gather: get(&lib, &path, "ncclAllGather")?,
                reduce_scatter: get(&lib, &path, "ncclReduceScatter")?,
                broadcast: get(&lib, &path, "ncclBroadcast")?,
                send: get(&lib, &path, "ncclSend")?,
                recv: get(&lib, &path, "ncclRecv")?,
                group_start: get(&lib, &path, "ncclGroupStart")?,
                group_end: get(&lib, &path, "ncclGroupEnd")?,
            }
        };
        Ok(Self {
            path,
            fns,
            _lib: lib,
        })
    }
}

/// Opens `name` with `dlopen`, returning the loader's message on failure.
fn open(name: &OsStr) -> Result<Library, String> {
    // SAFETY: opening a library runs its initialisers; NCCL's and RCCL's
    // only set up internal state. A path from the user is trusted as such.
    unsafe { Library::new(name) }.map_err(|e| e.to_string())
}

/// Opens the first of `names` that loads and resolves its functions; if none
/// opens, the error lists every name with the reason it failed.
fn open_first(names: &[&str]) -> Result<NcclLibrary, NcclError> {
    let mut tried = Vec::with_capacity(names.len());
    for name in names {
        match open(OsStr::new(name)) {
            Ok(lib) => return NcclLibrary::resolve(lib, (*name).to_string()),
            // glibc's message already starts with the name; others may not.
            Err(reason) if reason.starts_with(name) => tried.push(reason),
            Err(reason) => tried.push(format!("{name}: {reason}")),
        }
    }
    Err(NcclError::LibraryNotFound { tried })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_libraries_are_all_named_in_order_with_the_fix() {
        let names = [
            "libferrotron-absent-nccl.so.2",
            "libferrotron-absent-rccl.so",
        ];
        let Err(err) = open_first(&names) else {
            panic!("a library that does not exist was opened");
        };
        let msg = err.to_string();
        let first = msg.find(names[0]).expect("first name in the message");
        let second = msg.find(names[1]).expect("second name in the message");
        assert!(first < second, "{msg}");
        assert!(msg.contains("cannot open shared object file") || msg.contains("No such file"));
        assert!(msg.contains(LIBRARY_ENV), "{msg}");
        assert!(msg.contains("Install NCCL"), "{msg}");
        assert!(msg.contains("RCCL"), "{msg}");
    }

    #[test]
    fn default_search_tries_nccl_then_rccl_or_loads_one() {
        assert_eq!(
            LIBRARY_NAMES,
            ["libnccl.so.2", "libnccl.so", "librccl.so.1", "librccl.so"]
        );
        match NcclLibrary::load_from(None) {
            // The CI and development machines have neither library.
            Err(NcclError::LibraryNotFound { tried }) => {
                assert_eq!(tried.len(), LIBRARY_NAMES.len());
                for (entry, name) in tried.iter().zip(LIBRARY_NAMES) {
                    assert!(entry.starts_with(&format!("{name}: ")), "{entry}");
                }
            }
            // A GPU node with NCCL or RCCL installed.
            Ok(lib) => {
                assert!(LIBRARY_NAMES.contains(&lib.path()), "{}", lib.path());
                assert!(lib.version().unwrap() > 0);
            }
            Err(other) => panic!("unexpected error: {other}"),
        }
    }

    #[test]
    fn explicit_library_path_that_does_not_open_is_named() {
        let missing = "/nonexistent/ferrotron-test/libnccl.so.2";
        let Err(err) = NcclLibrary::load_from(Some(OsStr::new(missing))) else {
            panic!("a library that does not exist was opened");
        };
        assert!(matches!(err, NcclError::ExplicitLibrary { ref path, .. } if path == missing));
        let msg = err.to_string();
        assert!(msg.contains(&format!("{LIBRARY_ENV}={missing}")), "{msg}");

        // A file that exists but is not a shared library.
        let not_elf =
            std::env::temp_dir().join(format!("ferrotron-not-a-library-{}.so", std::process::id()));
        std::fs::write(&not_elf, "not an ELF file").unwrap();
        let result = NcclLibrary::load_from(Some(not_elf.as_os_str()));
        std::fs::remove_file(&not_elf).unwrap();
        let Err(NcclError::ExplicitLibrary { path, .. }) = result else {
            panic!("a text file was opened as a library");
        };
        assert_eq!(path, not_elf.to_string_lossy());
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn library_without_nccl_symbols_reports_the_missing_symbol() {
        // glibc's libc opens everywhere and exports no NCCL function.
        let Err(err) = NcclLibrary::load_from(Some(OsStr::new("libc.so.6"))) else {
            panic!("libc was accepted as NCCL");
        };
        let NcclError::MissingSymbol {
            symbol, library, ..
        } = &err
        else {
            panic!("expected a missing symbol, got: {err}");
        };
        assert_eq!((*symbol, library.as_str()), ("ncclGetVersion", "libc.so.6"));
        let msg = err.to_string();
        assert!(
            msg.contains("libc.so.6: symbol ncclGetVersion not found"),
            "{msg}"
        );
    }
}
