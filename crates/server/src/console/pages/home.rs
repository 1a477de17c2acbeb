//! `/`: each role's start page.

use axum::response::{IntoResponse, Redirect, Response};

use crate::console::layout::{Ctx, PageError};

pub(crate) async fn home(ctx: Ctx) -> Result<Response, PageError> {
    let viewer = ctx.viewer()?;
    Ok(Redirect::to(crate::console::home_of(viewer.user.role)).into_response())
}
