//! Small text corpora that the tests write for themselves (generated
//! here: nothing is downloaded or shipped).

use std::path::Path;

/// The vocabulary of the run-directory tests' word corpora.
pub const WORDS: [&str; 26] = [
    "the", "cat", "sat", "on", "a", "mat", "while", "dogs", "ran", "under", "bright", "stars",
    "and", "quiet", "rivers", "sang", "of", "old", "kings", "who", "lost", "their", "crowns", "to",
    "clever", "foxes",
];

/// Writes `n` words of `words` to `path`, the i-th chosen by a fixed
/// multiplicative hash of `i`, every 11th ending a sentence and a line.
pub fn write_words(path: &Path, words: &[&str], n: u64) {
    let text: String = (0..n)
        .map(|i| {
            let w = words[((i * 2654435761) >> 7) as usize % words.len()];
            if i % 11 == 10 {
                format!("{w}.\n")
            } else {
                format!("{w} ")
            }
        })
        .collect();
    std::fs::write(path, text).unwrap();
}

/// Writes the command-line tests' corpus to `path`: 400 numbered lines of
/// the quick brown fox.
pub fn write_lines(path: &Path) {
    let text: String = (0..400)
        .map(|i| {
            format!(
                "Line {i}: the quick brown fox jumps over the lazy dog {}.\n",
                i * 7 % 13
            )
        })
        .collect();
    std::fs::write(path, text).unwrap();
}
