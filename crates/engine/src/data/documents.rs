//! Documents of an input file for `data prepare`: a plain text file (or
//! `.gz`) is one document; a JSON-lines file (or `.jsonl.gz`) holds one
//! document per line, in a named string field.

use std::cell::Cell;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::rc::Rc;

use flate2::read::MultiGzDecoder;

use super::{read_corpus, DataError};

/// Counts the bytes read from the file (before decompression), for progress.
struct Counting<R> {
    inner: R,
    read: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.set(self.read.get() + n as u64);
        Ok(n)
    }
}

/// Calls `each(text, file_bytes_read)` for every document of `path`, in
/// order; `file_bytes_read` is how far into the file (compressed bytes for
/// `.gz`) reading has got. With `text_field`, the file is JSON lines and a
/// document is the string `text_field` of each line's object (blank lines
/// are skipped); without, the whole file is one document (see
/// [`read_corpus`]). An error of `each` stops the reading and is returned.
///
/// # Errors
///
/// Those of [`read_corpus`] for text files; for JSON lines
/// [`DataError::NotAFile`] / [`DataError::Io`] naming the file, and
/// [`DataError::BadJsonLine`] naming the file and line for a line that is
/// not an object with a string `text_field`.
pub fn for_each_document(
    path: &Path,
    text_field: Option<&str>,
    each: &mut dyn FnMut(String, u64) -> Result<(), DataError>,
) -> Result<(), DataError> {
    let Some(field) = text_field else {
        let text = read_corpus(path)?;
        let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        return each(text, size);
    };
    let io_err = |action: &'static str| {
        move |source| DataError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    };
    if !std::fs::metadata(path)
        .map_err(io_err("opening input file"))?
        .is_file()
    {
        return Err(DataError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    let read = Rc::new(Cell::new(0));
    let file = Counting {
        inner: File::open(path).map_err(io_err("opening input file"))?,
        read: read.clone(),
    };
    let is_gz = path
        .extension()
        .is_some_and(|ext| ext.eq_ignore_ascii_case("gz"));
    let reader: Box<dyn BufRead> = if is_gz {
        Box::new(BufReader::new(MultiGzDecoder::new(file)))
    } else {
        Box::new(BufReader::new(file))
    };
    for (i, line) in reader.lines().enumerate() {
        let bad = |reason: String| DataError::BadJsonLine {
            path: path.to_path_buf(),
            line: i + 1,
            reason,
        };
        let line = match line {
            Ok(line) => line,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData && !is_gz => {
                return Err(bad("not UTF-8 text".into()))
            }
            Err(e) => return Err(io_err("reading input file")(e)),
        };
        if line.trim().is_empty() {
            continue;
        }
        let mut value: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| bad(format!("not JSON: {e}")))?;
        let text = match value.get_mut(field).map(serde_json::Value::take) {
            Some(serde_json::Value::String(text)) => text,
            Some(other) => {
                return Err(bad(format!(
                    "field `{field}` is not a string but {}",
                    kind(&other)
                )))
            }
            None => return Err(bad(format!("no field `{field}` (--text-field)"))),
        };
        each(text, read.get())?;
    }
    Ok(())
}

/// The JSON type of `v`, for messages.
fn kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn collect(path: &Path, field: Option<&str>) -> Result<Vec<String>, DataError> {
        let mut docs = Vec::new();
        for_each_document(path, field, &mut |t, _| {
            docs.push(t);
            Ok(())
        })?;
        Ok(docs)
    }

    #[test]
    fn text_files_are_one_document_and_json_lines_one_per_line() {
        let dir = std::env::temp_dir().join(format!("ferrotron-docs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let plain = dir.join("a.txt");
        std::fs::write(&plain, "one\n\ntwo\n").unwrap();
        assert_eq!(collect(&plain, None).unwrap(), ["one\n\ntwo\n"]);

        let lines = "{\"text\": \"first\", \"id\": 1}\n\n{\"text\": \"sec\\nond\"}\n";
        let jsonl = dir.join("b.jsonl");
        std::fs::write(&jsonl, lines).unwrap();
        assert_eq!(
            collect(&jsonl, Some("text")).unwrap(),
            ["first", "sec\nond"]
        );
        let gz = dir.join("b.jsonl.gz");
        let mut enc =
            flate2::write::GzEncoder::new(File::create(&gz).unwrap(), flate2::Compression::fast());
        enc.write_all(lines.as_bytes()).unwrap();
        enc.finish().unwrap();
        assert_eq!(collect(&gz, Some("text")).unwrap(), ["first", "sec\nond"]);

        let e = collect(&jsonl, Some("body")).unwrap_err().to_string();
        assert!(
            e.contains("b.jsonl:1") && e.contains("no field `body`"),
            "{e}"
        );
        let broken = dir.join("c.jsonl");
        std::fs::write(&broken, "{\"text\": \"ok\"}\n{\"text\": 3}\nnot json\n").unwrap();
        let e = collect(&broken, Some("text")).unwrap_err().to_string();
        assert!(e.contains("c.jsonl:2") && e.contains("a number"), "{e}");
        let e = collect(Path::new("/dev/zero"), Some("text"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a regular file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
