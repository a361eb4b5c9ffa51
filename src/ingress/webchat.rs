//! The web chat: a browser cannot receive a WhatsApp message, so it asks for its answer.
//!
//! `POST /chat` keeps the question in the same durable inbox as WhatsApp messages and answers
//! 202 with an unguessable job id; `GET /chat/{id}` (polling) and `GET /chat/{id}/events`
//! (server-sent events) report the job from the store, so they work whichever node runs the
//! turn. Jobs of another session, unknown and expired ones all answer the same 404. When the
//! queue is too deep the question is refused (503, or 429 for one session asking too fast)
//! before anything is stored. Every 429 says the real wait in `Retry-After`.
//!
//! A session id is the visitor's credential: at least 128 bits on every route. A session is
//! bound to the first verified user who asks in it; from then on only that user asks in it or
//! reads it (403 for anyone else, resends of its message ids included). A history is read a
//! page at a time, bounded in bytes.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use futures_util::Stream;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;
use utoipa::{IntoParams, OpenApi, ToSchema};

use super::AppState;
use crate::clock::At;
use crate::ingress::{AddressRule, ApiError};
use crate::metrics::Metrics;
use crate::store::{ChatExchange, ChatJob, ChatSubmission, JobStatus, PersonLine, Submitted};
use crate::worker::Subscription;

const MAX_QUESTION_CHARS: usize = 4000;
const MAX_ID_CHARS: usize = 128;
/// A session id is the visitor's only credential: at least 22 of its 64 characters, 128 bits.
const SESSION_MIN_CHARS: usize = 22;
/// How often an event stream looks at the store unprompted: for turns other nodes run, and for
/// stage changes. A turn this node starts or ends wakes its session's streams at once.
const EVENTS_POLL: Duration = Duration::from_secs(3);
/// Event streams one session may keep open on one node (a few tabs).
const STREAMS_PER_SESSION: usize = 3;
/// ...and one client address (a family behind one router).
const STREAMS_PER_ADDRESS: usize = 12;
/// An event stream ends after this long, answered or not; the page reconnects.
const EVENTS_LIFETIME: Duration = Duration::from_secs(300);
/// How often a session's stream asks the store for people's replies. A reply may be written on
/// any node (the desk, the admin API, `sabi review`), so the store is asked, not this process:
/// one indexed read a second per open stream, and only pages after a hand-off open one.
const FEED_POLL: Duration = Duration::from_secs(1);
/// People's replies one read returns at most; the rest come at the next.
const FEED_LIMIT: usize = 50;
/// How many questions of a session a page of the history returns at most...
const HISTORY_LIMIT: usize = 100;
/// ...and how many bytes of JSON they may take (the latest always goes, however long): a
/// request of a few bytes cannot make the node hold megabytes for a client that reads slowly.
const HISTORY_MAX_BYTES: usize = 64 * 1024;

/// The chat page.
pub(super) async fn page() -> Html<&'static str> {
    Html(include_str!("chat.html"))
}

/// A customer's question.
#[derive(Debug, Deserialize, ToSchema)]
pub(super) struct Question {
    /// The question, 1 to 4,000 characters, not only spaces, and no control characters but new
    /// lines and tabs (`text` is accepted too, as the RQ design names it).
    #[serde(alias = "text")]
    #[schema(
        min_length = 1,
        max_length = 4000,
        pattern = r"^[^\x00-\x08\x0b-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f][^\x00-\x08\x0b-\x1f\x7f-\x9f]*$"
    )]
    question: String,
    /// The browser's session: 22 to 128 letters, digits, `-`, `_`, `.` or `:` (at least 128
    /// bits; the page makes 32 hex digits). The `X-Sabi-Session` header may carry it instead
    /// (then it may be left out here).
    #[serde(default)]
    #[schema(
        required = true,
        nullable = false,
        min_length = 22,
        max_length = 128,
        pattern = "^[A-Za-z0-9_.:-]+$"
    )]
    session_id: Option<String>,
    /// The browser's id for this message (same rules): a resend with the same id is the same
    /// question and the same job.
    #[serde(default)]
    #[schema(
        nullable,
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9_.:-]+$"
    )]
    message_id: Option<String>,
    /// Your site's id for a signed-in visitor, with `user_hash`: tools then act for this user,
    /// and the session becomes theirs alone (anyone else asking in it gets 403). Visible ASCII
    /// only: percent-encode other characters.
    #[serde(default)]
    #[schema(
        nullable,
        min_length = 1,
        max_length = 128,
        pattern = r"^[\x21-\x7e]+$"
    )]
    user_id: Option<String>,
    /// Hex HMAC-SHA256 of `user_id` with `webchat.identity_secret`, made by your server.
    #[serde(default)]
    #[schema(nullable, pattern = "^[0-9a-f]{64}$")]
    user_hash: Option<String>,
}

/// The job that will carry the answer.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Accepted {
    /// 32 hexadecimal digits, unguessable.
    job_id: String,
    status: JobStatus,
    status_url: String,
}

/// `POST /chat`: validate, refuse when too busy, store, 202; counted by outcome.
#[utoipa::path(
    post,
    path = "/chat",
    tag = "web chat",
    request_body = Question,
    responses(
        (status = 202, description = "Stored; ask the job for the answer", body = Accepted,
            headers(("Location" = String, description = "The job's status URL"))),
        (status = 400, description = "Not JSON", body = ErrorBody),
        (status = 401, description = "`user_hash` does not vouch for `user_id`", body = ErrorBody),
        (status = 403, description = "The session belongs to another verified user (or the asker is anonymous)", body = ErrorBody),
        (status = 422, description = "A field is missing or invalid", body = ErrorBody),
        (status = 429, description = "This session, or this address, asks too fast; see Retry-After", body = ErrorBody),
        (status = 503, description = "Too many questions wait; see Retry-After", body = ErrorBody),
    )
)]
pub(super) async fn submit(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Result<Json<Question>, JsonRejection>,
) -> Result<Response, ApiError> {
    let client = state
        .source
        .client(peer.ip(), super::source::forwarded_for(&headers).as_deref())
        .unwrap_or(peer.ip());
    let outcome = match AddressLimit::check(
        state.webchat.per_address.as_ref(),
        client,
        AddressRule::Questions,
    ) {
        Err(limited) => Err(limited),
        Ok(()) => accept(&state, client, &headers, body).await,
    };
    let label = match &outcome {
        Ok((_, true)) => "accepted",
        Ok((_, false)) => "duplicate",
        Err(e) => e.code(),
    };
    Metrics::count(&state.metrics.chat_questions, label);
    outcome.map(|(response, _)| response)
}

/// Questions, new sessions or hand-offs per client address: a token bucket each (GCRA), so one
/// address (a script, a flood) cannot take what every other visitor shares.
pub struct AddressLimit {
    limiter: governor::DefaultKeyedRateLimiter<IpAddr>,
    checks: AtomicU64,
}

impl AddressLimit {
    /// `n` a minute in bursts of `n`; `None` for 0 (no limit).
    pub fn per_minute(n: usize) -> Option<AddressLimit> {
        Self::of(n, governor::Quota::per_minute)
    }

    /// `n` an hour in bursts of `n`; `None` for 0 (no limit).
    pub fn per_hour(n: usize) -> Option<AddressLimit> {
        Self::of(n, governor::Quota::per_hour)
    }

    fn of(n: usize, quota: fn(std::num::NonZeroU32) -> governor::Quota) -> Option<AddressLimit> {
        let n = std::num::NonZeroU32::new(u32::try_from(n).unwrap_or(u32::MAX))?;
        Some(AddressLimit {
            limiter: governor::RateLimiter::keyed(quota(n)),
            checks: AtomicU64::new(0),
        })
    }

    /// Takes a token of `client`'s bucket, or says when the next one comes.
    fn check(
        limit: Option<&AddressLimit>,
        client: IpAddr,
        rule: AddressRule,
    ) -> Result<(), ApiError> {
        let Some(limit) = limit else { return Ok(()) };
        // Now and then, forget addresses whose buckets are full again: memory stays bounded by
        // the addresses of the last period.
        if limit.checks.fetch_add(1, Ordering::Relaxed) % 4096 == 4095 {
            limit.limiter.retain_recent();
            limit.limiter.shrink_to_fit();
        }
        limit
            .limiter
            .check_key(&network(client))
            .map_err(|not_until| {
                let wait =
                    not_until.wait_time_from(governor::clock::Clock::now(limit.limiter.clock()));
                ApiError::AddressLimited {
                    rule,
                    retry_after_secs: wait.as_secs_f64().ceil() as u64,
                }
            })
    }
}

impl AddressLimit {
    /// Takes a token of the bucket of `address` (as stored with an anonymous question) for
    /// something already done: a review item made for it. Nothing to refuse, so it only
    /// empties the bucket sooner for what the address asks next.
    pub fn spend(&self, address: &str) {
        if let Ok(client) = address.parse::<IpAddr>() {
            let _ = Self::check(Some(self), client, AddressRule::Handoffs);
        }
    }
}

/// The 202 for a question, and whether the question is new.
async fn accept(
    state: &AppState,
    client: IpAddr,
    headers: &HeaderMap,
    body: Result<Json<Question>, JsonRejection>,
) -> Result<(Response, bool), ApiError> {
    let Json(q) = body.map_err(|e| match e.status() {
        StatusCode::UNPROCESSABLE_ENTITY => ApiError::Invalid {
            field: "body",
            why: e.body_text(),
        },
        _ => ApiError::BadRequest(e.body_text()),
    })?;
    let session_id = body_session(headers, q.session_id)?;
    let question = q.question.trim();
    validate(question, &session_id, q.message_id.as_deref())?;
    let settings = &state.webchat;
    let user_id = vouched_user(settings, q.user_id.as_deref(), q.user_hash.as_deref())?;
    let now = state.clock.now();
    // A session bound to a verified user is theirs alone: nobody else's question, nor resend
    // of one of its message ids, is taken (the store decides again, atomically, on submit).
    if let Some(owner) = state.store.chat_session_owner(&session_id).await?
        && user_id.as_deref() != Some(owner.as_str())
    {
        return Err(ApiError::NotYourSession);
    }
    // A resend of a question already taken gets its job, however busy the queue is.
    if let Some(message_id) = q.message_id.as_deref()
        && let Some(job_id) = state
            .store
            .chat_job_for_message(&session_id, message_id)
            .await?
    {
        let status = state
            .store
            .chat_job(&job_id, now)
            .await?
            .map_or(JobStatus::Queued, |job| job.status);
        return Ok((accepted(job_id, status)?, false));
    }
    if settings.queue.depth(state, now).await? >= settings.max_queue as u64 {
        return Err(ApiError::Busy);
    }
    if user_id.is_none() {
        anonymous_limits(state, client, &session_id, question).await?;
    }
    let receipt = state
        .store
        .submit_chat(ChatSubmission {
            session_id: session_id.clone(),
            message_id: q.message_id.clone(),
            question: question.to_owned(),
            address: user_id.is_none().then(|| client.to_string()),
            user_id,
            business: settings.site.clone(),
            job_id: new_job_id()?,
            now,
            policy: settings.policy,
            keep: settings.result_ttl,
            per_minute: settings.per_session_per_minute as u64,
            max_queue: settings.max_queue as u64,
        })
        .await?;
    let receipt = match receipt {
        Submitted::Job(receipt) => receipt,
        Submitted::TooFast { retry_after } => {
            return Err(ApiError::TooFast {
                retry_after_secs: retry_after.as_secs_f64().ceil() as u64,
            });
        }
        Submitted::NotYours => return Err(ApiError::NotYourSession),
        Submitted::QueueFull => return Err(ApiError::Busy),
    };
    if let Some(due) = receipt.earliest_due {
        state.wakeup.due_at(due);
    }
    let status = match receipt.created {
        true => JobStatus::Queued,
        false => state
            .store
            .chat_job(&receipt.job_id, now)
            .await?
            .map_or(JobStatus::Queued, |job| job.status),
    };
    Ok((accepted(receipt.job_id, status)?, receipt.created))
}

/// The address a bucket is kept for: an IPv6 client's /64, since one subscriber holds a whole
/// /64 and could take a new address per request.
pub(super) fn network(client: IpAddr) -> IpAddr {
    match client {
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(std::net::Ipv6Addr::from(prefix))
        }
        v4 => v4,
    }
}

/// The per-address limits an anonymous visitor meets beyond the questions': new sessions, and
/// requests for a person (each one a desk item someone must read).
/// The question's session: its `session_id`, or the `X-Sabi-Session` header (the same when
/// both are sent).
fn body_session(headers: &HeaderMap, in_body: Option<String>) -> Result<String, ApiError> {
    match (header_session(headers), in_body) {
        (Some(header), Some(body)) if header != body => Err(ApiError::Invalid {
            field: "session_id",
            why: "differs from the X-Sabi-Session header".into(),
        }),
        (_, Some(session)) | (Some(session), None) => Ok(session),
        (None, None) => Err(ApiError::Invalid {
            field: "session_id",
            why: "is required (or the X-Sabi-Session header)".into(),
        }),
    }
}

async fn anonymous_limits(
    state: &AppState,
    client: IpAddr,
    session_id: &str,
    question: &str,
) -> Result<(), ApiError> {
    let settings = &state.webchat;
    if settings.new_sessions.is_some()
        && state
            .store
            .chat_history(session_id, None, 1)
            .await?
            .is_empty()
    {
        AddressLimit::check(
            settings.new_sessions.as_ref(),
            client,
            AddressRule::NewSessions,
        )?;
    }
    // Last: a question refused by anything before does not spend the scarcer hand-off token.
    if let Some(router) = &settings.router
        && router.hands_off(question)
    {
        AddressLimit::check(settings.handoffs.as_deref(), client, AddressRule::Handoffs)?;
    }
    Ok(())
}

/// The 202 that names a job.
fn accepted(job_id: String, status: JobStatus) -> Result<Response, ApiError> {
    let status_url = format!("/chat/{job_id}");
    let location =
        HeaderValue::from_str(&status_url).map_err(|e| ApiError::Internal(e.to_string()))?;
    let body = Accepted {
        job_id,
        status,
        status_url,
    };
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, location)],
        Json(body),
    )
        .into_response())
}

/// The visitor's user id when their site vouched for it; `None` for an anonymous visitor.
fn vouched_user(
    settings: &super::WebchatSettings,
    user_id: Option<&str>,
    user_hash: Option<&str>,
) -> Result<Option<String>, ApiError> {
    let (user_id, user_hash) = match (user_id, user_hash) {
        (None, None) => return Ok(None),
        (Some(user_id), Some(user_hash)) => (user_id, user_hash),
        _ => {
            return Err(ApiError::BadIdentity(
                "user_id and user_hash come together: the hash is your server's signature of the id",
            ));
        }
    };
    // It travels raw in the tools' `X-Sabi-Customer` header and in logs: visible ASCII only
    // (percent-encode anything else), so no line break, bidi mark or separator can hide in it.
    if user_id.is_empty()
        || user_id.len() > MAX_ID_CHARS
        || !user_id.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(ApiError::Invalid {
            field: "user_id",
            why: format!(
                "must be 1 to {MAX_ID_CHARS} visible ASCII characters (percent-encode others)"
            ),
        });
    }
    let Some(secret) = &settings.identity_secret else {
        return Err(ApiError::BadIdentity(
            "this site does not verify visitors (no webchat.identity_secret): send no user_id",
        ));
    };
    let expected = crate::whatsapp::sign(secret, user_id.as_bytes());
    let expected = expected.trim_start_matches("sha256=");
    if bool::from(
        expected
            .as_bytes()
            .ct_eq(user_hash.to_ascii_lowercase().as_bytes()),
    ) {
        Ok(Some(user_id.to_owned()))
    } else {
        Err(ApiError::BadIdentity(
            "user_hash is not the HMAC-SHA256 of user_id with this site's identity secret",
        ))
    }
}

fn validate(question: &str, session_id: &str, message_id: Option<&str>) -> Result<(), ApiError> {
    let invalid = |field: &'static str, why: &str| {
        Err(ApiError::Invalid {
            field,
            why: why.to_owned(),
        })
    };
    if question.is_empty() {
        return invalid("question", "must not be empty");
    }
    if question.chars().count() > MAX_QUESTION_CHARS {
        return invalid(
            "question",
            &format!("must be at most {MAX_QUESTION_CHARS} characters"),
        );
    }
    // A person types lines and tabs, never other control characters: each would come back
    // six bytes long in the history's JSON.
    if question
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return invalid(
            "question",
            "must not contain control characters (other than new lines and tabs)",
        );
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':');
    // The session is the visitor's only credential on every route: unguessable.
    if session_id.len() < SESSION_MIN_CHARS
        || session_id.len() > MAX_ID_CHARS
        || !session_id.chars().all(allowed)
    {
        return invalid(
            "session_id",
            &format!(
                "must be {SESSION_MIN_CHARS} to {MAX_ID_CHARS} letters, digits, '-', '_', '.' or ':' (at least 128 bits; the page makes 32 hex digits)"
            ),
        );
    }
    if let Some(message_id) = message_id
        && (message_id.is_empty()
            || message_id.len() > MAX_ID_CHARS
            || !message_id.chars().all(allowed))
    {
        return invalid(
            "message_id",
            "must be 1 to 128 letters, digits, '-', '_', '.' or ':'",
        );
    }
    Ok(())
}

/// The web chat's queue depth as last counted: counting costs a scan of the waiting
/// questions, so one request in a while counts and the others use its figure.
#[derive(Debug, Default)]
pub struct QueueGauge {
    depth: AtomicU64,
    counted_at_ms: AtomicI64,
}

/// How old a count may be before a request counts again.
const QUEUE_COUNT_EVERY_MS: i64 = 200;

impl QueueGauge {
    async fn depth(&self, state: &AppState, now: At) -> Result<u64, ApiError> {
        let last = self.counted_at_ms.load(Ordering::Acquire);
        let stale = last == 0 || now.millis() - last >= QUEUE_COUNT_EVERY_MS;
        // One request recounts; the others meanwhile use the last figure.
        if stale
            && self
                .counted_at_ms
                .compare_exchange(last, now.millis(), Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            let depth = state.store.chat_queue_depth().await?;
            self.depth.store(depth, Ordering::Release);
            return Ok(depth);
        }
        Ok(self.depth.load(Ordering::Acquire))
    }
}

/// 128 random bits: a job id cannot be guessed.
fn new_job_id() -> Result<String, ApiError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(hex::encode(bytes))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct Session {
    /// The session that asked. The `X-Sabi-Session` header may carry it instead (it stays out
    /// of proxies' access logs); the document names the query only, as OpenAPI cannot say
    /// "one of the two".
    #[param(min_length = 22, max_length = 128, pattern = "^[A-Za-z0-9_.:-]+$")]
    session_id: String,
}

/// The `X-Sabi-Session` header, when sent.
fn header_session(headers: &HeaderMap) -> Option<String> {
    headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_owned())
}

/// A session bound to a verified user is read by that user alone: the reading request names
/// them in `X-Sabi-User` and `X-Sabi-User-Hash` (the same `user_id` and `user_hash` as the
/// question's), or it is 403. An anonymous session is read by its id, as before.
async fn owner_only(
    state: &AppState,
    headers: &HeaderMap,
    session_id: &str,
) -> Result<(), ApiError> {
    let Some(owner) = state.store.chat_session_owner(session_id).await? else {
        return Ok(());
    };
    let named = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let user = vouched_user(&state.webchat, named(USER_HEADER), named(USER_HASH_HEADER))
        .map_err(|_| ApiError::NotYourSession)?;
    match user {
        Some(user) if bool::from(user.as_bytes().ct_eq(owner.as_bytes())) => Ok(()),
        _ => Err(ApiError::NotYourSession),
    }
}

/// The verified user reading a bound session, and the site's signature of it.
const USER_HEADER: &str = "x-sabi-user";
const USER_HASH_HEADER: &str = "x-sabi-user-hash";

/// The header that carries the session instead of `session_id`.
const SESSION_HEADER: &str = "x-sabi-session";

/// The session of the `X-Sabi-Session` header or of the query string, or a 422 naming it.
fn session(
    headers: &HeaderMap,
    query: Result<Query<Session>, QueryRejection>,
) -> Result<Session, ApiError> {
    let session_id = header_session(headers)
        .or_else(|| query.ok().map(|Query(s)| s.session_id))
        .ok_or_else(|| ApiError::Invalid {
            field: "session_id",
            why: "is required (or the X-Sabi-Session header)".into(),
        })?;
    validate("-", &session_id, None)?;
    Ok(Session { session_id })
}

/// `GET /chat/{job_id}?session_id=…`
#[utoipa::path(
    get,
    path = "/chat/{job_id}",
    tag = "web chat",
    params(
        ("job_id" = String, Path, description = "The job's id"),
        Session,
    ),
    responses(
        (status = 200, description = "The job", body = JobView),
        (status = 403, description = "The session belongs to a verified user: name them in X-Sabi-User and X-Sabi-User-Hash", body = ErrorBody),
        (status = 404, description = "Unknown, expired, or another session's job", body = ErrorBody),
        (status = 422, description = "No session id", body = ErrorBody),
    )
)]
pub(super) async fn status(
    State(state): State<AppState>,
    Path(job_id): Path<String>,
    headers: HeaderMap,
    query: Result<Query<Session>, QueryRejection>,
) -> Result<Response, ApiError> {
    let session = session(&headers, query)?;
    owner_only(&state, &headers, &session.session_id).await?;
    let job = owned_job(&state, &job_id, &session.session_id).await?;
    let mut response = Json(JobView::of(&job)).into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// The job, if it exists, has not expired, and belongs to `session_id`; one 404 otherwise.
async fn owned_job(state: &AppState, job_id: &str, session_id: &str) -> Result<ChatJob, ApiError> {
    let job = state.store.chat_job(job_id, state.clock.now()).await?;
    match job {
        Some(job) if bool::from(job.session_id.as_bytes().ct_eq(session_id.as_bytes())) => Ok(job),
        _ => Err(ApiError::JobNotFound),
    }
}

/// What a browser is told about a job.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub(super) struct JobView {
    job_id: String,
    status: JobStatus,
    /// Questions ahead of this one (queued), counted up to 10,000.
    #[serde(skip_serializing_if = "Option::is_none")]
    position: Option<u64>,
    /// What the turn is doing (started).
    #[serde(skip_serializing_if = "Option::is_none")]
    stage: Option<String>,
    /// The reply (finished).
    #[serde(skip_serializing_if = "Option::is_none")]
    answer: Option<Answer>,
    /// A kind sentence (failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub(super) struct Answer {
    text: Option<String>,
    /// Choices offered under the answer: the page shows them as buttons, and a tap asks the
    /// choice as the next question.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    options: Vec<String>,
}

impl JobView {
    fn of(job: &ChatJob) -> JobView {
        let mut view = JobView {
            job_id: job.job_id.clone(),
            status: job.status,
            position: None,
            stage: None,
            answer: None,
            error: None,
        };
        match job.status {
            JobStatus::Queued => view.position = Some(job.position.unwrap_or(0)),
            JobStatus::Started => {
                view.stage = Some(
                    job.stage
                        .clone()
                        .unwrap_or_else(|| "checking your message".into()),
                );
            }
            JobStatus::Finished => {
                view.answer = Some(Answer {
                    text: job.answer.clone(),
                    options: job.options.clone(),
                });
            }
            JobStatus::Failed => {
                view.error = Some(
                    "Sorry, we could not answer this automatically. A person from our team will reply here.".into(),
                )
            }
        }
        view
    }
}

/// One server-sent event, as the stream carries it.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)] // Describes the stream's events for the OpenAPI document only.
pub(super) struct StatusEvent {
    /// 1 (queued), 2 (started) or 3 (finished or failed): send it back as Last-Event-ID.
    id: String,
    /// `queued`, `started`, `finished` or `failed`.
    event: String,
    /// The job as `GET /chat/{job_id}` shows it, as JSON.
    data: String,
}

/// Every error body: a code to act on and a sentence to show.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ErrorBody {
    code: String,
    message: String,
}

/// Each status's place in the job's life: the id of its events, for Last-Event-ID.
fn rank(status: JobStatus) -> u64 {
    match status {
        JobStatus::Queued => 1,
        JobStatus::Started => 2,
        JobStatus::Finished | JobStatus::Failed => 3,
    }
}

/// `GET /chat/{job_id}/events?session_id=…`: the job's states as server-sent events, from the
/// current one (or the one after Last-Event-ID) to the answer.
#[utoipa::path(
    get,
    path = "/chat/{job_id}/events",
    tag = "web chat",
    params(
        ("job_id" = String, Path, description = "The job's id"),
        Session,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event id"),
    ),
    responses(
        (status = 200, description = "Events `queued` (id 1), `started` (2), `finished` or `failed` (3); data is the job as JSON",
            content_type = "text/event-stream", body = StatusEvent),
        (status = 403, description = "The session belongs to a verified user: name them in X-Sabi-User and X-Sabi-User-Hash", body = ErrorBody),
        (status = 404, description = "Unknown, expired, or another session's job", body = ErrorBody),
        (status = 422, description = "No session id", body = ErrorBody),
        (status = 429, description = "Too many streams open for this session or address: poll instead", body = ErrorBody),
        (status = 503, description = "Too many streams open on this node: poll instead", body = ErrorBody),
    )
)]
pub(super) async fn events(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(job_id): Path<String>,
    query: Result<Query<Session>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let session = session(&headers, query)?;
    owner_only(&state, &headers, &session.session_id).await?;
    // Subscribed before the job is read: a turn that starts between the two is then signalled,
    // not left to the slow poll (by which time a short turn has ended, and its stage is lost).
    let signal = state.webchat.signals.subscribe(&session.session_id);
    let job = owned_job(&state, &job_id, &session.session_id).await?;
    // Streams are bounded per node, per session and per address; the page falls back to
    // polling when refused.
    let client = state
        .source
        .client(peer.ip(), super::source::forwarded_for(&headers).as_deref())
        .unwrap_or(peer.ip());
    let deadline = tokio::time::Instant::now() + EVENTS_LIFETIME;
    let slot = state
        .webchat
        .stream_counts
        .take(&session.session_id, client, deadline)
        .map_err(too_many_streams)?;
    let permit = state
        .webchat
        .streams
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::Busy)?;
    let resume_after: u64 = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let stream = futures_util::stream::unfold(
        EventsState {
            state,
            job_id,
            last_sent: None,
            resume_after,
            pending: Some(job),
            deadline,
            done: false,
            signal,
            _held: (permit, slot),
        },
        next_event,
    );
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// Event streams open on this node, by session and by client address (an IPv6 client's /64):
/// each key's streams by the time they end, so a refusal can say when a place frees.
#[derive(Default)]
pub struct StreamCounts {
    open: std::sync::Mutex<std::collections::HashMap<String, Vec<tokio::time::Instant>>>,
}

/// One stream's place in [`StreamCounts`], given back when the stream ends.
struct StreamSlot {
    counts: Arc<StreamCounts>,
    keys: [String; 2],
    ends: tokio::time::Instant,
}

impl StreamCounts {
    /// A place for a stream of `session` from `client` that ends by `ends`, unless either has
    /// its fill; then how long until the first of theirs ends.
    fn take(
        self: &Arc<Self>,
        session: &str,
        client: IpAddr,
        ends: tokio::time::Instant,
    ) -> Result<StreamSlot, Duration> {
        let keys = [
            format!("session:{session}"),
            format!("address:{}", network(client)),
        ];
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let frees = [STREAMS_PER_SESSION, STREAMS_PER_ADDRESS]
            .iter()
            .zip(&keys)
            .filter_map(|(limit, key)| {
                let ends = open.get(key).filter(|ends| ends.len() >= *limit)?;
                ends.iter().min().copied()
            })
            .max();
        if let Some(frees) = frees {
            return Err(frees.saturating_duration_since(tokio::time::Instant::now()));
        }
        for key in &keys {
            open.entry(key.clone()).or_default().push(ends);
        }
        Ok(StreamSlot {
            counts: self.clone(),
            keys,
            ends,
        })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.counts.open.lock().unwrap_or_else(|e| e.into_inner());
        for key in &self.keys {
            if let Some(ends) = open.get_mut(key) {
                if let Some(at) = ends.iter().position(|e| *e == self.ends) {
                    ends.swap_remove(at);
                }
                if ends.is_empty() {
                    open.remove(key);
                }
            }
        }
    }
}

/// The 429 for a stream refused: the wait until one of the full key's streams ends.
fn too_many_streams(wait: Duration) -> ApiError {
    ApiError::TooManyStreams {
        retry_after_secs: wait.as_secs_f64().ceil() as u64,
    }
}

struct EventsState {
    state: AppState,
    job_id: String,
    /// What the last event said, so that only changes are sent.
    last_sent: Option<JobView>,
    resume_after: u64,
    /// A job read but not yet looked at.
    pending: Option<ChatJob>,
    deadline: tokio::time::Instant,
    done: bool,
    /// Wakes the stream when this node starts or ends one of the session's turns.
    signal: Subscription,
    /// Held while the stream is open: its place on the node, its session's and address's.
    _held: (tokio::sync::OwnedSemaphorePermit, StreamSlot),
}

async fn next_event(mut s: EventsState) -> Option<(Result<Event, Infallible>, EventsState)> {
    loop {
        if s.done || tokio::time::Instant::now() >= s.deadline {
            return None;
        }
        let job = match s.pending.take() {
            Some(job) => Some(job),
            None => {
                tokio::select! {
                    () = s.signal.changed() => {}
                    () = tokio::time::sleep(EVENTS_POLL) => {}
                }
                // A store that cannot answer now may answer at the next look.
                match s.state.store.chat_job(&s.job_id, s.state.clock.now()).await {
                    Ok(job) => job,
                    Err(_) => continue,
                }
            }
        };
        let job = job?;
        let id = rank(job.status);
        let body = JobView::of(&job);
        if id <= s.resume_after {
            // The browser already has this state; after the last one there is nothing to send.
            if id == 3 {
                return None;
            }
            continue;
        }
        if s.last_sent.as_ref() == Some(&body) {
            continue;
        }
        s.done = id == 3;
        let data = serde_json::to_string(&body).unwrap_or_default();
        s.last_sent = Some(body);
        let event = Event::default()
            .id(id.to_string())
            .event(status_name(job.status))
            .data(data);
        return Some((Ok(event), s));
    }
}

fn status_name(status: JobStatus) -> &'static str {
    match status {
        JobStatus::Queued => "queued",
        JobStatus::Started => "started",
        JobStatus::Finished => "finished",
        JobStatus::Failed => "failed",
    }
}

/// A page of the session's questions and answers, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct History {
    session_id: String,
    /// The latest exchanges before `before` (all of them up to 100, as many as fit in 64 KiB,
    /// and at least one).
    messages: Vec<ChatExchange>,
    /// Earlier exchanges exist: ask again with this as `before` for the page before this one.
    /// `null` when this page starts the history.
    before: Option<String>,
}

/// `GET /chat/history?before=…`: the session's questions and answers, the latest first, a page
/// at a time.
#[utoipa::path(
    get,
    path = "/chat/history",
    tag = "web chat",
    params(HistoryQuery),
    responses(
        (status = 200, description = "A page of the history", body = History),
        (status = 403, description = "The session belongs to a verified user: name them in X-Sabi-User and X-Sabi-User-Hash", body = ErrorBody),
        (status = 422, description = "An invalid session id or cursor", body = ErrorBody),
    )
)]
pub(super) async fn history(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<HistoryQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let query = query.map(|Query(q)| q).map_err(|_| ApiError::Invalid {
        field: "before",
        why: "must be the `before` of a history page".into(),
    })?;
    let session_id = long_session(&headers, query.session_id)?;
    owner_only(&state, &headers, &session_id).await?;
    let before = match query.before.as_deref() {
        None | Some("") => None,
        Some(cursor) => Some(cursor.parse::<i64>().map_err(|_| ApiError::Invalid {
            field: "before",
            why: "must be the `before` of a history page".into(),
        })?),
    };
    // One more than a page: whether anything is left before it.
    let mut exchanges = state
        .store
        .chat_history(&session_id, before, HISTORY_LIMIT + 1)
        .await?;
    let mut more = exchanges.len() > HISTORY_LIMIT;
    if more {
        exchanges.remove(0);
    }
    // The newest that fit in the page's bytes, however the text is written back (escapes).
    let mut bytes = 0;
    let mut keep = exchanges.len();
    for (n, exchange) in exchanges.iter().enumerate().rev() {
        let size = serde_json::to_vec(exchange).map_or(0, |json| json.len());
        if bytes + size > HISTORY_MAX_BYTES && keep < exchanges.len() {
            more = true;
            break;
        }
        bytes += size;
        keep = n;
    }
    let messages = exchanges.split_off(keep);
    let before = more
        .then(|| messages.first().map(|e| e.cursor.to_string()))
        .flatten();
    let mut response = Json(History {
        session_id,
        messages,
        before,
    })
    .into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// The session whose history is asked for, and where the page ends.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct HistoryQuery {
    /// The session, at least 22 characters (128 bits; the chat page makes 32 hex digits). The
    /// `X-Sabi-Session` header may carry it instead (kept out of proxies' access logs).
    #[param(
        required = true,
        min_length = 22,
        max_length = 128,
        pattern = "^[A-Za-z0-9_.:-]+$"
    )]
    session_id: Option<String>,
    /// The `before` of the page after the one wanted; none (or empty): the latest page.
    #[param(pattern = "^[0-9]*$")]
    before: Option<String>,
}

/// A session that reads by its id alone (a history, people's replies): from `X-Sabi-Session`
/// or the query, and unguessable ([`validate`]).
fn long_session(headers: &HeaderMap, in_query: Option<String>) -> Result<String, ApiError> {
    let session_id = header_session(headers).or(in_query).unwrap_or_default();
    validate("-", &session_id, None)?;
    Ok(session_id)
}

/// What people wrote to a session, and whether one holds it.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Feed {
    /// A person holds the conversation (a hand-off they have not closed): what the visitor
    /// writes now goes to that person, not to the assistant.
    held: bool,
    /// People's replies after `after`, oldest first (at most 50: ask again from `last_id`).
    lines: Vec<PersonLine>,
    /// Ask again with this as `after`, or send it to the stream as Last-Event-ID.
    last_id: i64,
}

/// The session (when not in `X-Sabi-Session`) and where to start.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct FeedQuery {
    /// At least 22 characters. The `X-Sabi-Session` header may carry it instead (the page
    /// sends it so).
    #[param(
        required = true,
        min_length = 22,
        max_length = 128,
        pattern = "^[A-Za-z0-9_.:-]+$"
    )]
    session_id: Option<String>,
    /// Only replies after this id (`last_id` of the last answer, or an event's id).
    after: Option<i64>,
}

/// `GET /chat/session?after=…`: people's replies to the session since `after`, and whether a
/// person holds it; the polling fallback of the session's stream.
#[utoipa::path(
    get,
    path = "/chat/session",
    tag = "web chat",
    params(
        FeedQuery,
    ),
    responses(
        (status = 200, description = "People's replies and whether a person holds the chat", body = Feed),
        (status = 403, description = "The session belongs to a verified user: name them in X-Sabi-User and X-Sabi-User-Hash", body = ErrorBody),
        (status = 422, description = "No session id, or one too short", body = ErrorBody),
    )
)]
pub(super) async fn feed(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<FeedQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let query = query.map(|Query(q)| q).map_err(|_| ApiError::Invalid {
        field: "after",
        why: "must be a whole number".into(),
    })?;
    let session_id = long_session(&headers, query.session_id)?;
    owner_only(&state, &headers, &session_id).await?;
    let after = query.after.unwrap_or(0);
    let feed = state
        .store
        .chat_feed(&session_id, after, FEED_LIMIT)
        .await?;
    let last_id = feed.lines.last().map_or(after, |l| l.id);
    let mut response = Json(Feed {
        held: feed.held,
        lines: feed.lines,
        last_id,
    })
    .into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// One event of a session's stream.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)] // Describes the stream's events for the OpenAPI document only.
pub(super) struct SessionEvent {
    /// The latest person's reply id so far: send it back as Last-Event-ID.
    id: String,
    /// `person` (a person's reply: data `{id, text, at_ms}`) or `state` (data `{held}`: whether
    /// a person holds the chat; sent first, then whenever it changes). The stream ends after a
    /// `state` that says nobody holds the chat.
    event: String,
    data: String,
}

/// `GET /chat/session/events`: people's replies to the session as server-sent events, live,
/// from the store, while a person holds the chat (it ends once nobody does); bounded and
/// resumable like a job's stream.
///
/// The session comes in `X-Sabi-Session`, like every other call of the page. A browser's
/// `EventSource` cannot send headers, so the page reads this stream with `fetch` (a readable
/// body, in every current browser) instead: no token to sign (nodes share no key by default,
/// and a token in the URL would land in access logs like the session itself), no cookie.
/// `?session_id=` works too, for clients that can only use `EventSource`.
#[utoipa::path(
    get,
    path = "/chat/session/events",
    tag = "web chat",
    params(
        FeedQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this reply id"),
    ),
    responses(
        (status = 200, description = "Events `state` (first, then on change) and `person` (each person's reply)",
            content_type = "text/event-stream", body = SessionEvent),
        (status = 403, description = "The session belongs to a verified user: name them in X-Sabi-User and X-Sabi-User-Hash", body = ErrorBody),
        (status = 422, description = "No session id, or one too short", body = ErrorBody),
        (status = 429, description = "Too many streams open for this session or address: poll `GET /chat/session` instead", body = ErrorBody),
        (status = 503, description = "Too many streams open on this node: poll instead", body = ErrorBody),
    )
)]
pub(super) async fn session_events(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    query: Result<Query<FeedQuery>, QueryRejection>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let query = query.map(|Query(q)| q).map_err(|_| ApiError::Invalid {
        field: "after",
        why: "must be a whole number".into(),
    })?;
    let session_id = long_session(&headers, query.session_id)?;
    owner_only(&state, &headers, &session_id).await?;
    let resume_after: Option<i64> = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok());
    let last_id = resume_after.or(query.after).unwrap_or(0).max(0);
    // The same bounds as a job's stream: per node, per session and per address.
    let client = state
        .source
        .client(peer.ip(), super::source::forwarded_for(&headers).as_deref())
        .unwrap_or(peer.ip());
    let deadline = tokio::time::Instant::now() + EVENTS_LIFETIME;
    let slot = state
        .webchat
        .stream_counts
        .take(&session_id, client, deadline)
        .map_err(too_many_streams)?;
    let permit = state
        .webchat
        .streams
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::Busy)?;
    let stream = futures_util::stream::unfold(
        FeedState {
            state,
            session_id,
            last_id,
            held: None,
            queue: std::collections::VecDeque::new(),
            deadline,
            first: true,
            store_failing: false,
            _held: (permit, slot),
        },
        next_feed_event,
    );
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

struct FeedState {
    state: AppState,
    session_id: String,
    /// The latest reply sent (or the browser had).
    last_id: i64,
    /// Whether a person held the chat at the last `state` event.
    held: Option<bool>,
    /// Events read but not yet sent.
    queue: std::collections::VecDeque<Event>,
    deadline: tokio::time::Instant,
    /// The first read goes at once.
    first: bool,
    /// The last read failed: logged once per outage, not at every look.
    store_failing: bool,
    _held: (tokio::sync::OwnedSemaphorePermit, StreamSlot),
}

async fn next_feed_event(mut s: FeedState) -> Option<(Result<Event, Infallible>, FeedState)> {
    loop {
        if let Some(event) = s.queue.pop_front() {
            return Some((Ok(event), s));
        }
        let now = tokio::time::Instant::now();
        // Nobody holds the chat (any more): nothing will come that a reconnect would not get.
        if now >= s.deadline || s.held == Some(false) {
            return None;
        }
        if !s.first {
            tokio::time::sleep(FEED_POLL.min(s.deadline - now)).await;
        }
        s.first = false;
        // A store that cannot answer now may answer at the next look.
        let feed = match s
            .state
            .store
            .chat_feed(&s.session_id, s.last_id, FEED_LIMIT)
            .await
        {
            Ok(feed) => feed,
            Err(e) => {
                if !s.store_failing {
                    tracing::warn!(error.message = %e, "a session's event stream cannot read the store; it keeps trying");
                }
                s.store_failing = true;
                continue;
            }
        };
        s.store_failing = false;
        // A person taking the chat is said before their lines, one letting it go after them,
        // whichever look first sees the change: the order never depends on when the look ran.
        let changed = s.held != Some(feed.held);
        s.held = Some(feed.held);
        if changed && feed.held {
            s.queue.push_back(state_event(s.last_id, true));
        }
        for line in feed.lines {
            s.last_id = line.id;
            let data = serde_json::to_string(&line).unwrap_or_default();
            s.queue.push_back(
                Event::default()
                    .id(line.id.to_string())
                    .event("person")
                    .data(data),
            );
        }
        if changed && !feed.held {
            s.queue.push_back(state_event(s.last_id, false));
        }
    }
}

/// A `state` event: whether a person holds the chat, as of the line `last_id`.
fn state_event(last_id: i64, held: bool) -> Event {
    Event::default()
        .id(last_id.to_string())
        .event("state")
        .data(serde_json::json!({ "held": held }).to_string())
}

/// The web chat's API, described from the handlers and types above so it cannot drift.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Sabi web chat",
        description = "Ask a question, then poll or stream its answer."
    ),
    paths(submit, status, events, history, feed, session_events),
    components(schemas(
        Question,
        Accepted,
        JobView,
        Answer,
        ErrorBody,
        History,
        ChatExchange,
        JobStatus,
        Feed,
        PersonLine
    ))
)]
pub(super) struct ApiDoc;

/// `GET /openapi.json`
pub(super) async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_ipv6_subscriber_is_one_address_however_many_it_takes() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().expect("address");
        let b: IpAddr = "2001:db8:1:2:ffff:1:2:3".parse().expect("address");
        let other: IpAddr = "2001:db8:1:3::1".parse().expect("address");
        assert_eq!(network(a), network(b));
        assert_ne!(network(a), network(other));
        let v4: IpAddr = "203.0.113.7".parse().expect("address");
        assert_eq!(network(v4), v4);
        let limit = AddressLimit::per_minute(2);
        for _ in 0..2 {
            assert!(AddressLimit::check(limit.as_ref(), a, AddressRule::Questions).is_ok());
        }
        assert!(AddressLimit::check(limit.as_ref(), b, AddressRule::Questions).is_err());
        assert!(AddressLimit::check(limit.as_ref(), other, AddressRule::Questions).is_ok());
    }
}
