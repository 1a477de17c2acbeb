//! Pagination of list endpoints: `limit` (default 100, at most 1000) and the cursor `after`
//! (the id of the last item of the previous page); the next cursor is in `X-Next-After`.

use axum::http::{HeaderName, HeaderValue};
use serde::Deserialize;

use crate::error::ApiError;

pub const DEFAULT_LIMIT: u32 = 100;
pub const MAX_LIMIT: u32 = 1000;

/// The header naming the cursor of the next page, present when the page is full.
pub static NEXT_AFTER: HeaderName = HeaderName::from_static("x-next-after");

/// `?limit=N&after=ID` of a list endpoint.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct PageQuery {
    /// Most items in the answer: 1 to 1000, 100 by default.
    #[serde(default)]
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// The id of the last item of the previous page (its `X-Next-After` header).
    #[serde(default)]
    pub after: Option<String>,
}

/// A validated page request.
#[derive(Debug, Clone)]
pub struct Page {
    pub limit: u32,
    pub after: Option<String>,
}

impl PageQuery {
    pub fn page(self) -> Result<Page, ApiError> {
        let limit = self.limit.unwrap_or(DEFAULT_LIMIT);
        if limit == 0 || limit > MAX_LIMIT {
            return Err(ApiError::Invalid(format!(
                "limit: {limit} is not between 1 and {MAX_LIMIT}"
            )));
        }
        Ok(Page {
            limit,
            after: self.after.filter(|a| !a.is_empty()),
        })
    }
}

impl Page {
    /// `X-Next-After` for a page of `len` items ending with `last`: only when it is full.
    pub fn next_header(&self, len: usize, last: Option<&str>) -> Option<(HeaderName, HeaderValue)> {
        let full = u32::try_from(len).unwrap_or(u32::MAX) >= self.limit;
        let last = last.filter(|_| full)?;
        HeaderValue::from_str(last)
            .ok()
            .map(|v| (NEXT_AFTER.clone(), v))
    }
}
