//! The browser's screenshots at both viewports and its layout checks (what does not fit a
//! phone, what is hidden but shown, fields without a label).

use base64::Engine as _;
use serde_json::json;
use std::path::{Path, PathBuf};

use super::{screenshot_dir, Browser, DESKTOP, PHONE};

impl Browser {
    /// Saves the whole page as `target/console-screenshots/NAME.LANG.desktop.png` and
    /// `... .phone.png` (1280 and 390 CSS pixels wide); their paths. The viewport is back at
    /// desktop size afterwards.
    pub fn screenshot(&self, name: &str) -> [PathBuf; 2] {
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).expect("the screenshot directory");
        let lang = self.lang.tag();
        let desktop = dir.join(format!("{name}.{lang}.desktop.png"));
        let phone = dir.join(format!("{name}.{lang}.phone.png"));
        self.capture(DESKTOP, false, &desktop);
        self.capture(PHONE, true, &phone);
        self.cdp("Emulation.clearDeviceMetricsOverride", json!({}));
        [desktop, phone]
    }

    /// A full-page PNG at `width`: the viewport is emulated (a headless window cannot be made
    /// narrower than the desktop's minimum), as a phone when `mobile`.
    fn capture(&self, (width, height): (u32, u32), mobile: bool, path: &Path) {
        self.cdp(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile}),
        );
        self.settle();
        // The page's whole height at this width, in CSS pixels.
        let metrics = self.cdp("Page.getLayoutMetrics", json!({}));
        let full_height = metrics["cssContentSize"]["height"]
            .as_f64()
            .unwrap_or(f64::from(height))
            .max(f64::from(height))
            // A runaway page is cut, not a 100 MB PNG.
            .min(8000.0);
        let shot = self.cdp(
            "Page.captureScreenshot",
            json!({
                "format": "png",
                "captureBeyondViewport": true,
                "clip": {"x": 0, "y": 0, "width": width, "height": full_height, "scale": 1},
            }),
        );
        let data = shot["data"].as_str().expect("screenshot data");
        let png = base64::engine::general_purpose::STANDARD
            .decode(data)
            .expect("a base64 screenshot");
        std::fs::write(path, png).unwrap_or_else(|e| panic!("cannot write {path:?}: {e}"));
    }

    /// Waits for two animation frames: the page has laid itself out after a change of size.
    fn settle(&self) {
        self.execute(
            "return new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(0))));",
            vec![],
        );
    }

    /// Why the page does not fit a phone, if it does not: it is wider than a phone's viewport
    /// (it would scroll sideways), or does not lay itself out for one at all (no
    /// `<meta name="viewport">`).
    pub fn phone_misfit(&self) -> Option<String> {
        self.cdp(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": PHONE.0, "height": PHONE.1, "deviceScaleFactor": 1, "mobile": true}),
        );
        self.settle();
        // The widest things, named `tag.class` (outermost first), to say what does not fit.
        let found = self.execute(
            r#"
            const width = arguments[0];
            const viewport = !!document.querySelector('meta[name="viewport"][content*="width=device-width"]');
            const wide = [];
            for (const el of document.body.querySelectorAll('*')) {
                const r = el.getBoundingClientRect();
                // What a scrolling box holds stays in it, unless it is positioned out of it.
                const escapes = ['absolute', 'fixed'].includes(getComputedStyle(el).position);
                let held = false;
                for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
                    if (getComputedStyle(p).overflowX !== 'visible') { held = true; break; }
                }
                if (r.width > 0 && Math.round(r.right) > width && (!held || escapes)) {
                    const parent = el.parentElement;
                    const pr = parent ? parent.getBoundingClientRect() : null;
                    // Only where it starts: the outermost element that is too wide.
                    if (!pr || escapes || Math.round(pr.right) <= width || parent === document.body) {
                        wide.push(el.tagName.toLowerCase() + (el.className && typeof el.className === 'string'
                            ? '.' + el.className.trim().split(/\s+/).join('.') : '')
                            + ' (' + Math.round(r.right) + ' px)');
                    }
                }
            }
            return [document.documentElement.scrollWidth, window.innerWidth, viewport, wide.slice(0, 5)];
            "#,
            vec![json!(PHONE.0)],
        );
        self.cdp("Emulation.clearDeviceMetricsOverride", json!({}));
        let scroll = found[0].as_u64().unwrap_or_default();
        let inner = found[1].as_u64().unwrap_or_default();
        let wide = &found[3];
        if found[2] != json!(true) {
            Some(format!(
                "no <meta name=\"viewport\" content=\"width=device-width\">: a phone shows it \
                 {inner} px wide, zoomed out"
            ))
        } else if inner != u64::from(PHONE.0) || scroll > inner {
            Some(format!(
                "at phone width ({} px) it is {scroll} px wide (a phone zooms out to show it \
                 all, or it scrolls sideways); too wide: {wide}",
                PHONE.0
            ))
        } else {
            None
        }
    }

    /// Elements the page hides (`hidden`) that are shown all the same (a style that sets their
    /// `display` wins over the attribute), as `tag.class "text"`.
    pub fn hidden_but_shown(&self) -> Vec<String> {
        let found = self.execute(
            r#"
            return Array.from(document.querySelectorAll('[hidden]'))
                .filter(el => getComputedStyle(el).display !== 'none')
                .map(el => el.tagName.toLowerCase()
                    + (typeof el.className === 'string' && el.className.trim()
                        ? '.' + el.className.trim().split(/\s+/).join('.') : '')
                    + ' ' + JSON.stringify((el.textContent || '').trim().slice(0, 40)));
            "#,
            vec![],
        );
        found
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    }

    /// Form fields a person fills that have no label (no `<label>`, no `aria-label`), as
    /// `tag[name]`.
    pub fn unlabelled_fields(&self) -> Vec<String> {
        let found = self.execute(
            r#"
            return Array.from(document.querySelectorAll('input, select, textarea'))
                .filter(el => !['hidden', 'submit', 'button'].includes(el.type))
                .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label')
                    && !el.getAttribute('aria-labelledby'))
                .map(el => el.tagName.toLowerCase() + '[' + (el.name || el.id || '?') + ']');
            "#,
            vec![],
        );
        found
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    }

    /// Panics when the page does not fit a phone (`phone_misfit`).
    pub fn assert_fits_phone(&self, page: &str) {
        if let Some(why) = self.phone_misfit() {
            panic!("{page} ({}): {why}", self.current_url());
        }
    }

    /// The viewport's CSS width as the page sees it.
    pub fn inner_width(&self) -> u64 {
        self.execute("return window.innerWidth;", vec![])
            .as_u64()
            .unwrap_or_default()
    }
}
