//! A dependency-free SVG bar chart of tokens/s, in the style of the loss
//! plot (`ferrotron_engine::metrics::write_loss_svg`).

use std::fmt::Write as _;

/// Renders one horizontal bar per `(label, tokens_per_s)`, longest bar
/// for the largest value, each bar with its value at its end. The left
/// margin fits the longest label (7 px per character at 12 px).
pub fn bars_svg(title: &str, bars: &[(String, f64)]) -> String {
    let longest = bars
        .iter()
        .map(|(l, _)| l.chars().count())
        .max()
        .unwrap_or(0);
    let left = (7.0 * longest as f64 + 20.0).max(120.0);
    let width = left + 480.0;
    const M: f64 = 20.0; // margins
    const ROW: f64 = 26.0;
    const T: f64 = 40.0; // top (title)
    const B: f64 = 40.0; // bottom (axis label)
    let h = T + ROW * bars.len() as f64 + B;
    let max = bars
        .iter()
        .map(|(_, v)| *v)
        .filter(|v| v.is_finite())
        .fold(0.0_f64, f64::max);
    let max = if max > 0.0 { max } else { 1.0 };
    let span = width - left - M - 70.0; // room for the value after the longest bar
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{width}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="24" text-anchor="middle" font-size="14">{}</text>"#,
        width / 2.0,
        escape(title)
    );
    let _ = writeln!(
        s,
        r#"<line x1="{left}" y1="{T}" x2="{left}" y2="{:.1}" stroke="black"/>"#,
        h - B
    );
    for (i, (label, value)) in bars.iter().enumerate() {
        let y = T + ROW * i as f64;
        let len = if value.is_finite() && *value > 0.0 {
            value / max * span
        } else {
            0.0
        };
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            left - 6.0,
            y + ROW / 2.0 + 4.0,
            escape(label)
        );
        let _ = writeln!(
            s,
            r##"<rect x="{left}" y="{:.1}" width="{len:.1}" height="{:.1}" fill="#1f77b4"/>"##,
            y + 4.0,
            ROW - 8.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{value:.0}</text>"#,
            left + len + 6.0,
            y + ROW / 2.0 + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">tokens/s (forward + backward + AdamW)</text>"#,
        left + span / 2.0,
        h - 12.0
    );
    s.push_str("</svg>\n");
    s
}

/// `text` with the XML special characters escaped.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_to_the_largest_value() {
        let svg = bars_svg("t", &[("a <cpu>".into(), 100.0), ("b".into(), 50.0)]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        // Span = 480 - 20 - 70 = 390: the largest bar fills it, the other half.
        assert!(svg.contains(r#"width="390.0""#), "{svg}");
        assert!(svg.contains(r#"width="195.0""#), "{svg}");
        assert!(svg.contains("a &lt;cpu&gt;"), "{svg}");
    }
}
