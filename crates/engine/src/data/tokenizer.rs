//! Byte-level BPE tokenizer (GPT-2 style): training, caching and encoding.

use std::io::Write;
use std::path::{Path, PathBuf};

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    Tokenizer, TokenizerBuilder, TokenizerImpl,
};

use super::DataError;

/// The single special token of every tokenizer trained here; it gets id 0.
pub const END_OF_TEXT: &str = "<|endoftext|>";

/// Smallest valid `vocab_size`: the 256 byte tokens plus [`END_OF_TEXT`].
pub const MIN_VOCAB_SIZE: usize = 256 + 1;

/// Target size in bytes of the pieces `encode` hands to the tokenizer in parallel.
const ENCODE_CHUNK_BYTES: usize = 64 * 1024;

/// Target size in bytes of the pieces fed to the BPE trainer.
const TRAIN_CHUNK_BYTES: usize = 16 * 1024;

type BpeTokenizer = TokenizerImpl<
    BPE,
    NormalizerWrapper,
    PreTokenizerWrapper,
    PostProcessorWrapper,
    DecoderWrapper,
>;

/// Trains a GPT-2 style byte-level BPE tokenizer on `text`.
///
/// The tokenizer has no normaliser, a `ByteLevel` pre-tokenizer (GPT-2 regex,
/// `add_prefix_space = false`), a `ByteLevel` post-processor and decoder, the
/// full 256-byte initial alphabet (so every input, any UTF-8, encodes without
/// unknown tokens) and one special token, [`END_OF_TEXT`], with id 0; byte
/// tokens follow and learned merges take the remaining ids up to
/// `vocab_size - 1`. The whole `text` is used, and the result is a
/// deterministic function of `(text, vocab_size)`. On the 5 MB embedded
/// corpus, vocab 4096 trains in a few seconds with an optimised build.
///
/// # Errors
///
/// As [`train_bpe_documents`].
pub fn train_bpe(text: &str, vocab_size: usize) -> Result<Tokenizer, DataError> {
    train_bpe_documents(&[text], vocab_size)
}

/// Trains the tokenizer of [`train_bpe`] on several documents.
///
/// Word counts are taken over every document, none spanning two of them,
/// so one document gives exactly `train_bpe(document, vocab_size)`; the
/// result is a deterministic function of `(documents, vocab_size)`.
///
/// # Errors
///
/// [`DataError::VocabTooSmall`] if `vocab_size < MIN_VOCAB_SIZE` (257);
/// [`DataError::CorpusTooSmallForVocab`] if the documents have too few
/// distinct pairs to learn exactly `vocab_size` tokens;
/// [`DataError::TokenizerTrain`] if the `tokenizers` crate fails.
pub fn train_bpe_documents(documents: &[&str], vocab_size: usize) -> Result<Tokenizer, DataError> {
    if vocab_size < MIN_VOCAB_SIZE {
        return Err(DataError::VocabTooSmall {
            requested: vocab_size,
            minimum: MIN_VOCAB_SIZE,
        });
    }
    let train_err = |source| DataError::TokenizerTrain { source };
    let byte_level = ByteLevel::new(false, false, true);
    let mut tokenizer: BpeTokenizer = TokenizerBuilder::new()
        .with_model(BPE::default())
        .with_normalizer(None)
        .with_pre_tokenizer(Some(PreTokenizerWrapper::ByteLevel(byte_level)))
        .with_post_processor(Some(PostProcessorWrapper::ByteLevel(byte_level)))
        .with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevelDecoder::default())))
        .build()
        .map_err(train_err)?;
    let mut trainer = BpeTrainer::builder()
        .vocab_size(vocab_size)
        .min_frequency(0)
        .show_progress(false)
        .special_tokens(vec![AddedToken::from(END_OF_TEXT, true)])
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    // The pieces split only where GPT-2 pre-tokenization splits anyway, so the
    // word counts (and the learned merges) equal those of the whole text.
    let pieces = documents
        .iter()
        .flat_map(|d| split_at_blank_lines(d, TRAIN_CHUNK_BYTES));
    tokenizer.train(&mut trainer, pieces).map_err(train_err)?;
    let tokenizer = Tokenizer::from(tokenizer);
    let learned = tokenizer.get_vocab_size(true);
    if learned != vocab_size {
        return Err(DataError::CorpusTooSmallForVocab {
            requested: vocab_size,
            learned,
            text_bytes: documents.iter().map(|d| d.len()).sum(),
        });
    }
    Ok(tokenizer)
}

/// The id of the token that ends a document, if `tokenizer` has one: the
/// first of [`EOS_TOKENS`] in its vocabulary (`<|endoftext|>`, id 0, for
/// the tokenizers trained here).
pub fn end_of_text_id(tokenizer: &Tokenizer) -> Option<u32> {
    EOS_TOKENS.iter().find_map(|t| tokenizer.token_to_id(t))
}

/// End-of-document tokens looked for by [`end_of_text_id`], in order:
/// GPT-2 and these tokenizers, Llama 2 and BLOOM, Llama 3, Gemma.
pub const EOS_TOKENS: [&str; 4] = [END_OF_TEXT, "</s>", "<|end_of_text|>", "<eos>"];

/// Writes `tokenizer` as `tokenizer.json` to `path` atomically: to a
/// temporary sibling (its directory created if missing), flushed to disk,
/// then renamed over `path`.
///
/// # Errors
///
/// [`DataError::TokenizerSave`] if it cannot be serialised;
/// [`DataError::Io`] naming the file or directory if writing fails.
pub fn save_tokenizer(tokenizer: &Tokenizer, path: &Path) -> Result<(), DataError> {
    save_atomic(tokenizer, path)
}

/// Writes `tokenizer` as JSON to a temporary sibling of `path`, then renames it.
fn save_atomic(tokenizer: &Tokenizer, path: &Path) -> Result<(), DataError> {
    let json = tokenizer
        .to_string(false)
        .map_err(|source| DataError::TokenizerSave {
            path: path.to_path_buf(),
            source,
        })?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(|source| DataError::Io {
        action: "creating tokenizer cache directory",
        path: dir.clone(),
        source,
    })?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "tokenizer.json".to_owned());
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(json.as_bytes())?;
        file.sync_all()
    };
    if let Err(source) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(DataError::Io {
            action: "writing temporary tokenizer file",
            path: tmp,
            source,
        });
    }
    std::fs::rename(&tmp, path).map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        DataError::Io {
            action: "renaming temporary tokenizer file into place at",
            path: path.to_path_buf(),
            source,
        }
    })
}

/// Encodes `text` into token ids (no special tokens added).
///
/// With GPT-2's pre-tokenizer ([`cuts_are_invisible`]), long text is cut
/// into pieces of about 64 KiB at blank lines and the pieces are encoded in
/// parallel; a cut is placed only where that pre-tokenizer splits anyway
/// (before the last `\n` of a blank-line run that is followed by a printable
/// ASCII character), so the result is identical to encoding the whole text
/// at once, and deterministic. Other tokenizers encode the text whole.
/// Returns one id per token, in text order; `[]` for empty text.
///
/// # Errors
///
/// [`DataError::Encode`] if the `tokenizers` crate fails.
pub fn encode(tok: &Tokenizer, text: &str) -> Result<Vec<u32>, DataError> {
    Ok(encode_documents(tok, &[text])?.pop().unwrap_or_default())
}

/// Encodes each of `documents` as [`encode`] does, all pieces of all
/// documents in one parallel batch; returns one id list per document, in
/// order.
///
/// # Errors
///
/// [`DataError::Encode`] if the `tokenizers` crate fails.
pub fn encode_documents(tok: &Tokenizer, documents: &[&str]) -> Result<Vec<Vec<u32>>, DataError> {
    let cut = cuts_are_invisible(tok);
    let mut pieces = Vec::new();
    let mut owner = Vec::new();
    for (d, &text) in documents.iter().enumerate() {
        let whole = if text.is_empty() { vec![] } else { vec![text] };
        let document = if cut {
            split_at_blank_lines(text, ENCODE_CHUNK_BYTES)
        } else {
            whole
        };
        for piece in document {
            pieces.push(piece);
            owner.push(d);
        }
    }
    let encodings = tok
        .encode_batch_fast(pieces, false)
        .map_err(|source| DataError::Encode {
            text_bytes: documents.iter().map(|d| d.len()).sum(),
            source,
        })?;
    let mut ids = vec![Vec::new(); documents.len()];
    for (encoding, d) in encodings.iter().zip(owner) {
        ids[d].extend_from_slice(encoding.get_ids());
    }
    Ok(ids)
}

/// Whether cutting text at blank lines ([`split_at_blank_lines`]) leaves
/// its tokens unchanged: for GPT-2's pre-tokenizer (byte-level with its
/// regex, no prefix space) and no normaliser, as Ferrotron's and GPT-2's
/// tokenizers have. Not for others: a normaliser that prepends `▁` to each
/// input (Llama 2's) would add a token at every cut, and Llama 3's split
/// pattern keeps `\n\n` as one pre-token.
fn cuts_are_invisible(tok: &Tokenizer) -> bool {
    tok.get_normalizer().is_none()
        && matches!(
            tok.get_pre_tokenizer(),
            Some(PreTokenizerWrapper::ByteLevel(b)) if b.use_regex && !b.add_prefix_space
        )
}

/// Cuts `text` into pieces of at least `target` bytes (except the last).
///
/// A cut at byte `p` requires `text[p - 1] == '\n'`, `text[p] == '\n'` and
/// `text[p + 1]` printable ASCII. The GPT-2 regex then yields the same
/// pre-tokens whether or not the text is cut there: the whitespace run before
/// `p` ends one pre-token (`\s+(?!\S)`), and `"\n"` at `p` is its own
/// pre-token before the word that follows. Empty text gives no pieces.
fn split_at_blank_lines(text: &str, target: usize) -> Vec<&str> {
    let bytes = text.as_bytes();
    let target = target.max(1);
    let mut pieces = Vec::with_capacity(bytes.len() / target + 1);
    let mut start = 0;
    let mut i = target;
    while i + 1 < bytes.len() {
        if bytes[i] == b'\n' && bytes[i - 1] == b'\n' && bytes[i + 1].is_ascii_graphic() {
            pieces.push(&text[start..i]);
            start = i;
            i = start + target;
        } else {
            i += 1;
        }
    }
    if start < bytes.len() {
        pieces.push(&text[start..]);
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A few kilobytes of varied synthetic text with newlines and blank lines.
    fn synthetic_text() -> String {
        let words = [
            "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "then", "runs",
            "far", "away", "into", "forest", "where", "nobody", "finds", "him",
        ];
        let mut s = String::new();
        let mut k = 7usize;
        for line in 0..400 {
            for _ in 0..(3 + line % 7) {
                k = (k * 31 + 17) % 1009;
                s.push_str(words[k % words.len()]);
                s.push(if k.is_multiple_of(5) { ',' } else { ' ' });
                if k.is_multiple_of(5) {
                    s.push(' ');
                }
            }
            s.push_str(if line % 4 == 3 { ".\n\n" } else { "\n" });
        }
        s
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("ferrotron-data-tok-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn round_trip_ascii_and_non_ascii() {
        let tok = train_bpe(&synthetic_text(), 320).unwrap();
        for text in [
            "the quick brown fox\n\njumps over\n  the lazy dog.\n",
            "café – naïve 日本語 🙂\r\n\ttabs",
            "",
            "<|endoftext|>after special",
        ] {
            let ids = encode(&tok, text).unwrap();
            assert_eq!(tok.decode(&ids, false).unwrap(), text);
        }
        // The special token is recognised as a single id (0).
        let ids = encode(&tok, "a<|endoftext|>b").unwrap();
        assert!(ids.contains(&0));
        assert_eq!(tok.token_to_id(END_OF_TEXT), Some(0));
    }

    #[test]
    fn vocab_size_and_determinism() {
        let text = synthetic_text();
        let a = train_bpe(&text, 300).unwrap();
        let b = train_bpe(&text, 300).unwrap();
        assert_eq!(a.get_vocab_size(true), 300);
        assert_eq!(a.to_string(false).unwrap(), b.to_string(false).unwrap());
        let ids = encode(&a, &text).unwrap();
        assert!(ids.iter().all(|&id| (id as usize) < 300));
        assert!(
            ids.len() < text.len() * 3 / 4,
            "BPE should compress the text"
        );
    }

    #[test]
    fn vocab_errors() {
        let err = train_bpe("abc", 100).unwrap_err();
        assert!(matches!(err, DataError::VocabTooSmall { .. }), "{err}");
        let err = train_bpe("abc abc", 5000).unwrap_err();
        assert!(
            matches!(
                err,
                DataError::CorpusTooSmallForVocab {
                    requested: 5000,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn chunked_encoding_equals_whole() {
        let corpus = super::super::embedded_corpus();
        let mut end = 300_000;
        while !corpus.is_char_boundary(end) {
            end += 1;
        }
        let text = &corpus[..end];
        let tok = train_bpe(&synthetic_text(), 300).unwrap();
        let pieces = split_at_blank_lines(text, 4096);
        assert!(pieces.len() > 20);
        assert_eq!(pieces.concat(), text);
        let whole = tok.encode_fast(text, false).unwrap().get_ids().to_vec();
        assert_eq!(encode(&tok, text).unwrap(), whole);
        let mut chunked = Vec::new();
        for p in pieces {
            chunked.extend_from_slice(tok.encode_fast(p, false).unwrap().get_ids());
        }
        assert_eq!(chunked, whole);
    }

    /// A tokenizer whose normaliser prepends `▁` to each input (as Llama
    /// 2's does) encodes a long document whole: cut, each piece would
    /// start with one more `▁`.
    #[test]
    fn a_prepending_tokenizer_encodes_long_documents_whole() {
        use tokenizers::normalizers::Prepend;
        let mut tok = train_bpe(&synthetic_text(), 300).unwrap();
        assert!(cuts_are_invisible(&tok));
        tok.with_normalizer(Some(NormalizerWrapper::Prepend(Prepend::new("▁".into()))));
        assert!(!cuts_are_invisible(&tok));
        let text = "a\n\nb\n\n".repeat(40_000);
        let whole = tok
            .encode_fast(text.as_str(), false)
            .unwrap()
            .get_ids()
            .to_vec();
        assert_eq!(encode(&tok, &text).unwrap(), whole);
        assert_eq!(
            encode_documents(&tok, &["", &text]).unwrap(),
            [vec![], whole]
        );
    }

    #[test]
    fn split_edge_cases() {
        assert!(split_at_blank_lines("", 4).is_empty());
        assert_eq!(split_at_blank_lines("ab", 1), vec!["ab"]);
        assert_eq!(split_at_blank_lines("a\n\nb", 1), vec!["a\n", "\nb"]);
        assert_eq!(split_at_blank_lines("a\n\n\n", 1), vec!["a\n\n\n"]);
        assert_eq!(split_at_blank_lines("a\n\n b", 1), vec!["a\n\n b"]);
    }

    #[test]
    fn save_is_atomic_and_loads_back() {
        let dir = temp_dir("save");
        let path = dir.join("sub").join("tokenizer.json");
        let tok = train_bpe(&synthetic_text(), 300).unwrap();
        save_tokenizer(&tok, &path).unwrap();
        // No temporary file is left behind.
        let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers.len(), 1, "{leftovers:?}");
        let again = Tokenizer::from_file(&path).unwrap();
        assert_eq!(
            tok.to_string(false).unwrap(),
            again.to_string(false).unwrap()
        );
        assert_eq!(end_of_text_id(&again), Some(0));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn documents_train_and_encode_like_one_text_each() {
        let text = synthetic_text();
        let (a, b) = text.split_at(text.len() / 2);
        let one = train_bpe(&text, 300).unwrap();
        assert_eq!(
            train_bpe_documents(&[&text], 300)
                .unwrap()
                .to_string(false)
                .unwrap(),
            one.to_string(false).unwrap()
        );
        let two = train_bpe_documents(&[a, b], 300).unwrap();
        assert_eq!(two.get_vocab_size(true), 300);
        let ids = encode_documents(&two, &[a, "", b]).unwrap();
        assert_eq!(ids.len(), 3);
        assert_eq!(ids[0], encode(&two, a).unwrap());
        assert!(ids[1].is_empty());
        assert_eq!(ids[2], encode(&two, b).unwrap());
    }

    /// Full-corpus training at vocab 4096, as the default run does (about 10 s:
    /// two trainings and two encodings of the 5 MB corpus).
    #[test]
    fn full_corpus_bpe_4096() {
        let corpus = super::super::embedded_corpus();
        let t0 = std::time::Instant::now();
        let tok = train_bpe(&corpus, 4096).unwrap();
        let train_s = t0.elapsed().as_secs_f64();
        let t1 = std::time::Instant::now();
        let ids = encode(&tok, &corpus).unwrap();
        let encode_s = t1.elapsed().as_secs_f64();
        eprintln!(
            "full corpus: {} bytes, train {train_s:.2} s, encode {encode_s:.2} s, {} tokens",
            corpus.len(),
            ids.len()
        );
        assert_eq!(tok.decode(&ids, false).unwrap(), corpus);
        let t2 = std::time::Instant::now();
        let whole = tok.encode_fast(corpus.as_str(), false).unwrap();
        eprintln!("whole-text encode {:.2} s", t2.elapsed().as_secs_f64());
        assert_eq!(whole.get_ids(), ids.as_slice());
        let again = train_bpe(&corpus, 4096).unwrap();
        assert_eq!(
            tok.to_string(false).unwrap(),
            again.to_string(false).unwrap()
        );
    }
}
