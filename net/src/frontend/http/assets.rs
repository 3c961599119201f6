//! The dashboard's files, embedded in the binary: one page, its script and style, and uPlot
//! (vendored from its npm package, its licence beside it in `page/vendor/uplot/`). Nothing is
//! fetched at run time, from here or from anywhere else.

/// The page.
const INDEX: &str = include_str!("page/index.html");
const APP_JS: &str = include_str!("page/app.js");
const APP_CSS: &str = include_str!("page/app.css");
const UPLOT_JS: &str = include_str!("page/vendor/uplot/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("page/vendor/uplot/uPlot.min.css");
const UPLOT_LICENSE: &str = include_str!("page/vendor/uplot/LICENSE");

/// The API's description (OpenAPI 3.1).
pub const OPENAPI: &str = include_str!("openapi.json");

/// The content type and bytes of the file `name` (`index.html`, or a file under `/assets/`).
pub fn get(name: &str) -> Option<(&'static str, &'static [u8])> {
    const JS: &str = "text/javascript; charset=utf-8";
    const CSS: &str = "text/css; charset=utf-8";
    let (kind, body) = match name {
        "index.html" => ("text/html; charset=utf-8", INDEX),
        "app.js" => (JS, APP_JS),
        "app.css" => (CSS, APP_CSS),
        "uPlot.iife.min.js" => (JS, UPLOT_JS),
        "uPlot.min.css" => (CSS, UPLOT_CSS),
        "uPlot.LICENSE" => ("text/plain; charset=utf-8", UPLOT_LICENSE),
        _ => return None,
    };
    Some((kind, body.as_bytes()))
}
