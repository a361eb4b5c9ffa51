//! The admin API's broadcasts, with the review API's token rules:
//!
//! - `POST /admin/broadcasts` `{"name", "template": {"name", "language"}, "from", "recipients":
//!   [{"to", "params", "tz"}]` or `"audience_csv"` with `"params"` naming its columns (and
//!   `"phone_column"` when its header is not a usual phone header), `"country",
//!   "at", "until", "quiet_hours", "tz", "rate", "key", "dry_run"}`: keeps it (once per key),
//!   or with `dry_run` says who would get it, who is left out, and when the last goes, keeping
//!   nothing. What Meta would refuse on the day (a template name or language code it does not
//!   take, a phone number as `from`, a rate of 0, a past `at` or `until`) is refused with 422
//!   naming the field; a rate above the number's pace is capped, saying so in `notes`;
//! - `GET /admin/broadcasts`, `GET /admin/broadcasts/{id}`;
//! - `GET /admin/broadcasts/{id}/recipients?state=&limit=`, `GET /admin/broadcasts/{id}/report`;
//! - `POST /admin/broadcasts/{id}/pause` `{"reason"}`, `.../resume`, `.../cancel`.

use axum::Json;
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, AppState};
use crate::broadcast::audience;
use crate::broadcast::checks::{self, Mistake};
use crate::broadcast::plan::{self, DryRun, Refused};
use crate::broadcast::report::{self, Prices};
use crate::clock::At;
use crate::config::BroadcastSettings;
use crate::store::{self, Control, NewBroadcast, RecipientState, When};

#[derive(Debug, Deserialize)]
pub(super) struct Create {
    name: String,
    template: TemplateRef,
    from: String,
    #[serde(default)]
    recipients: Vec<Listed>,
    audience_csv: Option<String>,
    #[serde(default)]
    params: Vec<String>,
    /// The audience file's column of numbers, when its header is not a usual phone header.
    phone_column: Option<String>,
    country: Option<String>,
    at: Option<Time>,
    until: Option<Time>,
    rate: Option<u32>,
    /// `HH:MM-HH:MM`, on each recipient's clock.
    quiet_hours: Option<String>,
    /// The zone of recipients without their own.
    tz: Option<String>,
    key: Option<String>,
    #[serde(default)]
    dry_run: bool,
}

/// A time as the API takes it: milliseconds since the epoch, or RFC 3339 text (with an offset
/// one instant, without one a wall-clock time on each recipient's clock).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Time {
    Millis(i64),
    Text(String),
}

impl Time {
    fn when(self, field: &'static str) -> Result<When, ApiError> {
        match self {
            Time::Millis(ms) => Ok(When::At(At::from_millis(ms))),
            Time::Text(text) => When::parse(&text).map_err(|why| ApiError::Invalid { field, why }),
        }
    }
}

#[derive(Debug, Deserialize)]
struct TemplateRef {
    name: String,
    language: String,
}

#[derive(Debug, Deserialize)]
struct Listed {
    to: String,
    #[serde(default)]
    params: Vec<String>,
    tz: Option<String>,
}

/// Broadcasts go at 20 messages a second unless asked otherwise.
const DEFAULT_RATE: u32 = 20;

pub(super) async fn create(
    State(state): State<AppState>,
    Json(c): Json<Create>,
) -> Result<Json<Value>, ApiError> {
    // A retry with the key gets what the first try kept, whatever has changed since (the
    // start passed, its customers reached).
    if let Some(key) = c.key.as_deref().filter(|_| !c.dry_run)
        && let Some(made) = state.store.keyed_broadcast(key).await?
    {
        return Ok(Json(
            json!({ "created": false, "broadcast": made, "notes": [] }),
        ));
    }
    let country = c
        .country
        .as_deref()
        .map(crate::phone::country_code)
        .transpose()
        .map_err(|why| ApiError::Invalid {
            field: "country",
            why,
        })?
        .or_else(|| state.admin.default_country.clone());
    let rows = match (&c.audience_csv, c.recipients.is_empty()) {
        (Some(csv), true) => audience::parse(
            csv,
            &c.params,
            country.as_deref(),
            c.phone_column.as_deref(),
        )
        .map_err(|e| ApiError::Invalid {
            field: "audience_csv",
            why: e.to_string(),
        })?,
        (None, false) => audience::listed(
            c.recipients.into_iter().map(|r| (r.to, r.params, r.tz)),
            country.as_deref(),
        )
        .map_err(|e| ApiError::Invalid {
            field: "recipients",
            why: e.to_string(),
        })?,
        _ => {
            return Err(ApiError::Invalid {
                field: "recipients",
                why: "give recipients or audience_csv, one of them".into(),
            });
        }
    };
    let settings = state.admin.broadcasts;
    let pace =
        checks::pace(c.rate.unwrap_or(DEFAULT_RATE), settings.number_rate).map_err(invalid)?;
    let now = state.clock.now();
    let mut broadcast = NewBroadcast {
        key: c.key,
        name: c.name,
        template: c.template.name,
        language: c.template.language,
        business: c.from,
        now,
        start_at: now,
        until: None,
        rate: pace.rate,
        body: None,
        hours: None,
        recipients: rows.into_iter().map(plan::recipient).collect(),
    };
    plan::check_names(&broadcast).map_err(invalid)?;
    let asked = plan::Asked {
        at: c.at.map(|t| t.when("at")).transpose()?,
        until: c.until.map(|t| t.when("until")).transpose()?,
        quiet_hours: c.quiet_hours.as_deref(),
        tz: c.tz.as_deref(),
    };
    plan::schedule(&mut broadcast, asked).map_err(|e| ApiError::Invalid {
        field: e.field,
        why: e.why,
    })?;
    let preflight = state.admin.preflight.as_ref();
    if let Some(preflight) = preflight {
        preflight.check(&mut broadcast).await.map_err(refused)?;
    }
    let configured = settings.messaging_limit;
    let limit = plan::messaging_limit(preflight, &broadcast.business, configured).await;
    let settings = BroadcastSettings {
        messaging_limit: limit.per_day,
        ..settings
    };
    let headroom = plan::leave_out(state.store.as_ref(), &settings, &mut broadcast).await?;
    if !c.dry_run && broadcast.recipients.iter().all(|r| r.skipped.is_some()) {
        return Err(ApiError::Invalid {
            field: "recipients",
            why: "every recipient is left out: nothing to send (a dry run lists them with why)"
                .into(),
        });
    }
    let notes: Vec<String> = pace
        .note()
        .into_iter()
        .chain(limit.note(configured))
        .collect();
    if c.dry_run {
        let mut dry = DryRun::of(&broadcast, headroom, limit);
        dry.notes = notes;
        return Ok(Json(json!(dry)));
    }
    let (made, created) = state.store.create_broadcast(broadcast).await?;
    Ok(Json(
        json!({ "created": created, "broadcast": made, "notes": notes }),
    ))
}

fn invalid(m: Mistake) -> ApiError {
    ApiError::Invalid {
        field: m.field,
        why: m.why,
    }
}

fn refused(e: Refused) -> ApiError {
    match e {
        // Meta could not be asked: try again later.
        Refused::Graph(_) => {
            ApiError::Store(store::Error::Unavailable(format!("the broadcast {e}")))
        }
        _ => ApiError::Invalid {
            field: "template",
            why: e.to_string(),
        },
    }
}

pub(super) async fn report(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Json<Value>, ApiError> {
    let prices = Prices {
        by_prefix: &state.admin.prices,
        currency: &state.admin.currency,
    };
    let report = report::report(state.store.as_ref(), id, &prices)
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok(Json(json!(report)))
}

pub(super) async fn list(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let broadcasts = state.store.broadcasts(1_000).await?;
    Ok(Json(json!({ "broadcasts": broadcasts })))
}

pub(super) async fn show(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Json<Value>, ApiError> {
    let b = state.store.broadcast(id).await?.ok_or(ApiError::NotFound)?;
    Ok(Json(json!(b)))
}

#[derive(Debug, Deserialize)]
pub(super) struct RecipientsQuery {
    state: Option<String>,
    limit: Option<usize>,
}

pub(super) async fn recipients(
    State(state): State<AppState>,
    Path(id): Path<i64>,
    Query(q): Query<RecipientsQuery>,
) -> Result<Json<Value>, ApiError> {
    let wanted = q
        .state
        .as_deref()
        .map(|s| {
            RecipientState::parse(s).ok_or_else(|| ApiError::Invalid {
                field: "state",
                why: format!("is not a recipient state: {s:?}"),
            })
        })
        .transpose()?;
    let limit = q.limit.unwrap_or(1_000).min(100_000);
    let found = state.store.broadcast_recipients(id, wanted, limit).await?;
    Ok(Json(json!({ "recipients": found })))
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct Reason {
    reason: Option<String>,
}

pub(super) async fn pause(
    State(state): State<AppState>,
    Path(id): Path<i64>,
    reason: Option<Json<Reason>>,
) -> Result<Json<Value>, ApiError> {
    let reason = reason.and_then(|Json(r)| r.reason);
    control(&state, id, Control::Pause, reason).await
}

pub(super) async fn resume(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Json<Value>, ApiError> {
    control(&state, id, Control::Resume, None).await
}

pub(super) async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Json<Value>, ApiError> {
    control(&state, id, Control::Cancel, None).await
}

async fn control(
    state: &AppState,
    id: i64,
    control: Control,
    reason: Option<String>,
) -> Result<Json<Value>, ApiError> {
    let b = state.store.control_broadcast(id, control, reason).await?;
    Ok(Json(json!(b)))
}
