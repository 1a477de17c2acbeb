//! Monthly invoices (JSON or CSV) for tenants and earnings per node for hosts.

use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{Datelike, NaiveDate};
use gpurent_types::api::{Earnings, ErrorBody, Invoice, InvoiceLine};
use gpurent_types::Money;

use super::usage::{whose, window};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiPath, ApiQuery};
use crate::state::AppState;

#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct InvoiceQuery {
    /// Whose invoice: a team of the caller's (by id), or anyone's for an admin (default: the
    /// caller, or the team their token acts for).
    user_id: Option<String>,
    /// `json` (default) or `csv`; `Accept: text/csv` also asks for CSV.
    format: Option<String>,
}

/// The invoice of a calendar month (UTC): every charge to the tenant in it, per reservation
/// and per volume.
#[utoipa::path(get, path = "/api/v1/invoices/{month}", tag = "users", security(("bearer" = [])),
    params(("month" = String, Path, description = "YYYY-MM"), InvoiceQuery),
    responses((status = 200, description = "The invoice: JSON, or CSV when `Accept: text/csv` or `format=csv`",
        content((Invoice = "application/json"), (String = "text/csv"))),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn invoice(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiPath(month): ApiPath<String>,
    ApiQuery(query): ApiQuery<InvoiceQuery>,
) -> Result<Response, ApiError> {
    let csv = match query.format.as_deref() {
        Some("csv") => true,
        Some("json") => false,
        Some(other) => {
            return Err(ApiError::Invalid(format!(
                "format: {other:?} is not json or csv"
            )))
        }
        None => headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("text/csv")),
    };
    let start = NaiveDate::parse_from_str(&format!("{month}-01"), "%Y-%m-%d")
        .ok()
        .filter(|_| month.len() == 7)
        .ok_or_else(|| ApiError::Invalid(format!("month: {month:?} is not YYYY-MM")))?;
    let end = start
        .checked_add_months(chrono::Months::new(1))
        .ok_or_else(|| ApiError::Invalid(format!("month: {month:?} is out of range")))?;
    let (from, to) = (
        start.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc(),
        end.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc(),
    );
    let user_id = whose(&state, &caller, query.user_id).await?;
    let user = state.store.get_user(&user_id).await?;
    let lines = state.store.invoice_lines(&user_id, from, to).await?;
    let storage = state.store.storage_lines(&user_id, from, to).await?;
    let total = lines
        .iter()
        .map(|l| l.amount)
        .chain(storage.iter().map(|l| l.amount))
        .try_fold(Money::ZERO, Money::checked_add)
        .ok_or_else(|| ApiError::Invalid("the invoice total overflows".into()))?;
    let invoice = Invoice {
        number: format!(
            "GR-{:04}{:02}-{}",
            start.year(),
            start.month(),
            user_id.chars().take(8).collect::<String>()
        ),
        user_id,
        user_name: user.name,
        month,
        period_start: from,
        period_end: to,
        currency: state.live().prices.currency().to_owned(),
        lines,
        storage,
        total,
    };
    if csv {
        let filename = format!("attachment; filename=\"{}.csv\"", invoice.number);
        Ok((
            [
                (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()),
                (header::CONTENT_DISPOSITION, filename),
            ],
            invoice_csv(&invoice),
        )
            .into_response())
    } else {
        Ok(Json(invoice).into_response())
    }
}

/// One row per line and a total row; RFC 4180 quoting.
pub(crate) fn invoice_csv(invoice: &Invoice) -> String {
    let mut out = String::from(
        "invoice,month,reservation_id,gpu_type,gpu_count,vram_gb,tier,price_per_hour,started_at,ended_at,amount,currency,volume_id,volume,size_bytes,price_per_gb_month\r\n",
    );
    let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
        t.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_default()
    };
    let row = |out: &mut String, fields: &[String]| {
        let cells: Vec<String> = fields.iter().map(|f| csv_cell(f)).collect();
        out.push_str(&cells.join(","));
        out.push_str("\r\n");
    };
    for InvoiceLine {
        reservation_id,
        gpu_type,
        gpu_count,
        vram_gb,
        tier,
        price_per_hour,
        started_at,
        ended_at,
        amount,
    } in &invoice.lines
    {
        row(
            &mut out,
            &[
                invoice.number.clone(),
                invoice.month.clone(),
                reservation_id.clone(),
                gpu_type.clone(),
                gpu_count.to_string(),
                vram_gb.map(|g| g.to_string()).unwrap_or_default(),
                tier.to_string(),
                price_per_hour.to_string(),
                time(*started_at),
                time(*ended_at),
                amount.to_string(),
                invoice.currency.clone(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ],
        );
    }
    // A volume's line: its time is from its making to its removal.
    for line in &invoice.storage {
        let mut cells = vec![String::new(); 16];
        cells[0] = invoice.number.clone();
        cells[1] = invoice.month.clone();
        cells[8] = time(Some(line.created_at));
        cells[9] = time(line.deleted_at);
        cells[10] = line.amount.to_string();
        cells[11] = invoice.currency.clone();
        cells[12] = line.volume_id.clone();
        cells[13] = line.name.clone();
        cells[14] = line.size_bytes.to_string();
        cells[15] = line.price_per_gb_month.to_string();
        row(&mut out, &cells);
    }
    let mut total = vec![String::new(); 16];
    total[0] = invoice.number.clone();
    total[1] = invoice.month.clone();
    total[2] = "total".to_owned();
    total[10] = invoice.total.to_string();
    total[11] = invoice.currency.clone();
    row(&mut out, &total);
    out
}

fn csv_cell(value: &str) -> String {
    if value.contains([',', '"', '\r', '\n']) {
        format!("\"{}\"", value.replace('"', "\"\""))
    } else {
        value.to_owned()
    }
}

#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct EarningsQuery {
    /// Start (inclusive): `YYYY-MM-DD` or RFC 3339. Default: the beginning.
    from: Option<String>,
    /// End (exclusive), same forms. Default: now.
    to: Option<String>,
    /// Whose earnings: a team of the caller's (by id), or anyone's for an admin (default:
    /// the caller, or the team their token acts for).
    user_id: Option<String>,
}

/// What the caller's nodes (or, for an admin, any host's) earned, per node.
#[utoipa::path(get, path = "/api/v1/earnings", tag = "nodes", security(("bearer" = [])),
    params(EarningsQuery),
    responses((status = 200, body = Earnings), (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn earnings(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<EarningsQuery>,
) -> Result<Json<Earnings>, ApiError> {
    let user_id = whose(&state, &caller, query.user_id).await?;
    let (from, to) = window(&state, query.from.as_deref(), query.to.as_deref())?;
    let nodes = state.store.earnings(&user_id, from, to).await?;
    let total = nodes
        .iter()
        .try_fold(Money::ZERO, |t, n| t.checked_add(n.earned))
        .ok_or_else(|| ApiError::Invalid("the earnings total overflows".into()))?;
    Ok(Json(Earnings {
        user_id,
        from,
        to,
        total,
        nodes,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_with_separators_are_quoted() {
        assert_eq!(csv_cell("RTX4090"), "RTX4090");
        assert_eq!(csv_cell("a,b"), "\"a,b\"");
        assert_eq!(csv_cell("say \"hi\""), "\"say \"\"hi\"\"\"");
    }
}
