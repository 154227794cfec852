//! A dependency-free SVG bar chart of tokens/s, in the style of the loss
//! plot (`ferrotron_engine::metrics::write_loss_svg`).

use std::fmt::Write as _;

/// Renders one horizontal bar per `(label, tokens_per_s)`, longest bar
/// for the largest value, each bar with its value at its end.
pub fn bars_svg(title: &str, bars: &[(String, f64)]) -> String {
    const W: f64 = 900.0;
    const L: f64 = 420.0; // left margin (labels)
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
    let span = W - L - M - 70.0; // room for the value after the longest bar
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="24" text-anchor="middle" font-size="14">{}</text>"#,
        W / 2.0,
        escape(title)
    );
    let _ = writeln!(
        s,
        r#"<line x1="{L}" y1="{T}" x2="{L}" y2="{:.1}" stroke="black"/>"#,
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
            L - 6.0,
            y + ROW / 2.0 + 4.0,
            escape(label)
        );
        let _ = writeln!(
            s,
            r##"<rect x="{L}" y="{:.1}" width="{len:.1}" height="{:.1}" fill="#1f77b4"/>"##,
            y + 4.0,
            ROW - 8.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{value:.0}</text>"#,
            L + len + 6.0,
            y + ROW / 2.0 + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">tokens/s (forward + backward + AdamW)</text>"#,
        L + span / 2.0,
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
        // Span = 900 - 420 - 20 - 70 = 390: the largest bar fills it, the other half.
        assert!(svg.contains(r#"width="390.0""#), "{svg}");
        assert!(svg.contains(r#"width="195.0""#), "{svg}");
        assert!(svg.contains("a &lt;cpu&gt;"), "{svg}");
    }
}
