//! The console's two languages: English and Simplified Chinese, chosen by `?lang=`, then the
//! remembered choice (a cookie), then `Accept-Language`.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};

/// The cookie that remembers a language picked with `?lang=`.
pub(crate) const LANG_COOKIE: &str = "gpurent_lang";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Lang {
    #[default]
    En,
    ZhCn,
}

impl Lang {
    /// Every visible string is written in both languages where it is used, so a page cannot
    /// miss a translation.
    pub(crate) fn t(self, en: &'static str, zh: &'static str) -> &'static str {
        match self {
            Lang::En => en,
            Lang::ZhCn => zh,
        }
    }

    /// The `<html lang>` and `?lang=` word.
    pub(crate) fn code(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::ZhCn => "zh-CN",
        }
    }

    pub(crate) fn parse(word: &str) -> Option<Lang> {
        let word = word.trim().to_ascii_lowercase();
        if word == "en" || word.starts_with("en-") {
            Some(Lang::En)
        } else if word == "zh" || word.starts_with("zh-") {
            Some(Lang::ZhCn)
        } else {
            None
        }
    }

    /// The best of an `Accept-Language` header's languages that we have (by `q`).
    fn from_accept(value: &str) -> Option<Lang> {
        let mut best: Option<(Lang, u32)> = None;
        for part in value.split(',') {
            let mut fields = part.split(';');
            let Some(lang) = fields.next().and_then(Lang::parse) else {
                continue;
            };
            let q = fields
                .find_map(|f| f.trim().strip_prefix("q="))
                .and_then(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // 0..=1000
            let q = (q.clamp(0.0, 1.0) * 1000.0) as u32;
            if q > 0 && best.is_none_or(|(_, b)| q > b) {
                best = Some((lang, q));
            }
        }
        best.map(|(lang, _)| lang)
    }

    pub(crate) fn of(query: Option<&str>, headers: &HeaderMap) -> Lang {
        if let Some(lang) = query.and_then(query_lang) {
            return lang;
        }
        // Either name: under TLS it is `__Host-` prefixed; a language is nothing to protect.
        let remembered = cookie(headers, LANG_COOKIE)
            .or_else(|| cookie(headers, &format!("__Host-{LANG_COOKIE}")))
            .and_then(Lang::parse);
        if let Some(lang) = remembered {
            return lang;
        }
        headers
            .get(header::ACCEPT_LANGUAGE)
            .and_then(|v| v.to_str().ok())
            .and_then(Lang::from_accept)
            .unwrap_or_default()
    }
}

/// `lang=...` of a query string.
pub(crate) fn query_lang(query: &str) -> Option<Lang> {
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix("lang="))
        .and_then(Lang::parse)
}

/// The value of a cookie of the request (the first, where a browser sends several).
pub(crate) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    crate::proxy::access::cookie_values(headers, name)
        .into_iter()
        .next()
}

impl<S: Send + Sync> FromRequestParts<S> for Lang {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(Lang::of(parts.uri.query(), &parts.headers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(accept: &str, cookie: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::ACCEPT_LANGUAGE,
            HeaderValue::from_str(accept).unwrap(),
        );
        if let Some(c) = cookie {
            h.insert(header::COOKIE, HeaderValue::from_str(c).unwrap());
        }
        h
    }

    #[test]
    fn accept_language_picks_the_best_we_have() {
        assert_eq!(
            Lang::of(None, &headers("zh-CN,zh;q=0.9,en;q=0.8", None)),
            Lang::ZhCn
        );
        assert_eq!(
            Lang::of(None, &headers("fr, en;q=0.5, zh;q=0.4", None)),
            Lang::En
        );
        assert_eq!(Lang::of(None, &headers("de", None)), Lang::En);
        assert_eq!(
            Lang::of(None, &headers("en;q=0.1, zh-TW;q=0.6", None)),
            Lang::ZhCn
        );
    }

    #[test]
    fn the_query_beats_the_cookie_which_beats_the_header() {
        let h = headers("en", Some("a=b; gpurent_lang=zh-CN"));
        assert_eq!(Lang::of(None, &h), Lang::ZhCn);
        assert_eq!(Lang::of(Some("x=1&lang=en"), &h), Lang::En);
    }
}
