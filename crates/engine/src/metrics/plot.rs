//! A dependency-free SVG plot of the training and validation loss.
//!
//! Written by hand rather than with `plotters`, whose text rendering pulls in
//! system font libraries.

use std::fmt::Write as _;

/// Renders the loss curves as an SVG document.
///
/// `train` and `val` are `(step, loss)` points; either may be empty.
pub fn write_loss_svg(train: &[(f64, f64)], val: &[(f64, f64)]) -> String {
    const W: f64 = 640.0;
    const H: f64 = 400.0;
    const L: f64 = 60.0; // left margin (y labels)
    const B: f64 = 40.0; // bottom margin (x labels)
    const M: f64 = 20.0; // top and right margins
    let all = train.iter().chain(val.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all.filter(|(_, y)| y.is_finite()) {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    if x1 - x0 < 1e-9 {
        x1 = x0 + 1.0;
    }
    if y1 - y0 < 1e-9 {
        y1 = y0 + 1.0;
    }
    let px = |x: f64| L + (x - x0) / (x1 - x0) * (W - L - M);
    let py = |y: f64| M + (y1 - y) / (y1 - y0) * (H - M - B);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<rect x="{L}" y="{M}" width="{}" height="{}" fill="none" stroke="black"/>"#,
        W - L - M,
        H - M - B
    );
    for i in 0..=4 {
        let f = i as f64 / 4.0;
        let (xv, yv) = (x0 + f * (x1 - x0), y0 + f * (y1 - y0));
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{xv:.0}</text>"#,
            px(xv),
            H - B + 16.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{yv:.2}</text>"#,
            L - 6.0,
            py(yv) + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">step</text>"#,
        (L + W - M) / 2.0,
        H - 6.0
    );
    let _ = writeln!(
        s,
        r#"<text x="14" y="{:.1}" text-anchor="middle" transform="rotate(-90 14 {:.1})">loss (nats/token)</text>"#,
        (M + H - B) / 2.0,
        (M + H - B) / 2.0
    );
    for (points, colour, label, row) in [
        (train, "#1f77b4", "train loss", 0.0),
        (val, "#d62728", "val loss", 1.0),
    ] {
        if points.is_empty() {
            continue;
        }
        let path: Vec<String> = points
            .iter()
            .filter(|(_, y)| y.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/>"#,
            path.join(" ")
        );
        let ly = M + 16.0 + 16.0 * row;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{ly:.1}" fill="{colour}" text-anchor="end">{label}</text>"#,
            W - M - 8.0
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_both_series_within_the_frame() {
        let svg = write_loss_svg(
            &[(1.0, 8.0), (2.0, 6.0), (3.0, 5.0)],
            &[(0.0, 8.5), (3.0, 5.5)],
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        // The highest loss sits on the top edge of the frame, the last step on the right edge.
        assert!(svg.contains("60.0,20.0"), "{svg}");
        assert!(svg.contains("620.0,"), "{svg}");
    }
}
