//! Text corpora: the embedded Shakespeare corpus and user-supplied text files.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use flate2::read::MultiGzDecoder;

use super::DataError;

/// The gzip-compressed embedded corpus (see `crates/engine/assets/README.md`):
/// 42 public-domain Shakespeare plays and poems from Project Gutenberg,
/// 5,057,321 bytes of ASCII text with `\n` line endings once decompressed.
pub const EMBEDDED_CORPUS_GZ: &[u8] = include_bytes!("../../assets/shakespeare.txt.gz");

/// Decompresses and returns the embedded Shakespeare corpus.
///
/// Returns the whole text (about 5.06 MB, ASCII, `\n` line endings). Each call
/// decompresses afresh (tens of milliseconds); keep the result if it is needed
/// more than once.
///
/// # Panics
///
/// Only if the asset compiled into the binary is corrupt, which is a build
/// error, not something a user can cause.
pub fn embedded_corpus() -> String {
    let mut text = String::with_capacity(5_100_000);
    MultiGzDecoder::new(EMBEDDED_CORPUS_GZ)
        .read_to_string(&mut text)
        .expect(
            "embedded corpus asset shakespeare.txt.gz is corrupt (rebuild with make_corpus.py)",
        );
    text
}

/// Reads a user-supplied UTF-8 text corpus.
///
/// Files whose name ends in `.gz` are gzip-decompressed first (multi-member
/// gzip is accepted); anything else is read as plain text. The text is
/// returned unchanged (no line-ending or BOM normalisation).
///
/// # Errors
///
/// [`DataError::Io`] naming `path` if the file cannot be opened, read or
/// decompressed; [`DataError::NotAFile`] if it is not a regular file (a
/// directory, `/dev/zero`, a pipe); [`DataError::NotUtf8`] naming `path` if
/// its (decompressed) content is not valid UTF-8; [`DataError::EmptyCorpus`]
/// if it holds only whitespace.
pub fn read_corpus(path: &Path) -> Result<String, DataError> {
    let io_err = |action: &'static str| {
        move |source| DataError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    };
    if !std::fs::metadata(path)
        .map_err(io_err("opening corpus file"))?
        .is_file()
    {
        return Err(DataError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    let is_gz = path
        .extension()
        .is_some_and(|ext| ext.eq_ignore_ascii_case("gz"));
    let bytes = if is_gz {
        let file = File::open(path).map_err(io_err("opening corpus file"))?;
        let mut bytes = Vec::new();
        MultiGzDecoder::new(file)
            .read_to_end(&mut bytes)
            .map_err(io_err("decompressing gzip corpus file"))?;
        bytes
    } else {
        std::fs::read(path).map_err(io_err("reading corpus file"))?
    };
    let text = String::from_utf8(bytes).map_err(|source| DataError::NotUtf8 {
        path: path.to_path_buf(),
        source,
    })?;
    if text.trim().is_empty() {
        return Err(DataError::EmptyCorpus {
            path: path.to_path_buf(),
        });
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "ferrotron-data-corpus-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn directories_devices_and_empty_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("ferrotron-corpus-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = read_corpus(&dir).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let e = read_corpus(Path::new("/dev/zero")).unwrap_err().to_string();
        assert!(
            e.contains("/dev/zero") && e.contains("not a regular file"),
            "{e}"
        );
        let empty = dir.join("empty.txt");
        std::fs::write(&empty, " \n\n").unwrap();
        let e = read_corpus(&empty).unwrap_err().to_string();
        assert!(e.contains("empty.txt") && e.contains("is empty"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn embedded_corpus_is_shakespeare() {
        let text = embedded_corpus();
        assert_eq!(text.len(), 5_057_321);
        assert!(text.len() > 4_000_000);
        assert!(text.contains("ROMEO"));
        assert!(text.contains("To be, or not to be"));
        assert!(!text.contains('\r'));
        assert!(text.is_ascii());
    }

    #[test]
    fn read_plain_and_gz() {
        let dir = temp_dir("read");
        let content = "Hello, café – naïve\nsecond line\n";
        let plain = dir.join("c.txt");
        std::fs::write(&plain, content).unwrap();
        assert_eq!(read_corpus(&plain).unwrap(), content);

        let gz = dir.join("c.txt.gz");
        let mut enc =
            flate2::write::GzEncoder::new(File::create(&gz).unwrap(), flate2::Compression::best());
        enc.write_all(content.as_bytes()).unwrap();
        enc.finish().unwrap();
        assert_eq!(read_corpus(&gz).unwrap(), content);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn read_errors_name_the_file() {
        let dir = temp_dir("errors");
        let missing = dir.join("missing.txt");
        let err = read_corpus(&missing).unwrap_err();
        assert!(matches!(err, DataError::Io { .. }));
        assert!(err.to_string().contains("missing.txt"), "{err}");

        let bad = dir.join("bad.txt");
        std::fs::write(&bad, [b'a', 0xff, 0xfe]).unwrap();
        let err = read_corpus(&bad).unwrap_err();
        assert!(matches!(err, DataError::NotUtf8 { .. }));
        assert!(err.to_string().contains("bad.txt"), "{err}");

        let not_gz = dir.join("plain.gz");
        std::fs::write(&not_gz, "not gzip").unwrap();
        let err = read_corpus(&not_gz).unwrap_err();
        assert!(err.to_string().contains("plain.gz"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
