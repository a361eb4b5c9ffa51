//! `ApiError`: every error an HTTP route answers, with its status, code and message together.
//!
//! Bodies are `{"code": "snake_case", "message": "..."}`. A 5xx never carries internals: the
//! cause is logged here, once, and the client gets a fixed sentence.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::whatsapp::NotJson;
use crate::store;
use crate::whatsapp::Rejection;

/// Seconds a client should wait before retrying a 503.
const RETRY_AFTER_SECS: &str = "5";

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadSignature(#[from] Rejection),
    #[error("webhook verification refused")]
    VerificationRefused,
    #[error("{0}")]
    NotJson(#[from] NotJson),
    #[error("request body larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the request body did not arrive in time")]
    BodyTimeout,
    #[error("too many large request bodies are being read")]
    LargeBodiesBusy,
    #[error("this address has too many request bodies being read")]
    AddressBodiesBusy,
    #[error("could not read the request body: {0}")]
    UnreadableBody(String),
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error("{0}")]
    BadRequest(String),
    #[error("{field} {why}")]
    Invalid { field: &'static str, why: String },
    #[error("too many questions are waiting")]
    Busy,
    #[error("this session is asking too fast")]
    TooFast { retry_after_secs: u64 },
    #[error("this chat session belongs to another user")]
    NotYourSession,
    #[error("this address has sent too many {}", .rule.noun())]
    AddressLimited {
        rule: AddressRule,
        retry_after_secs: u64,
    },
    #[error("too many event streams for this session or address")]
    TooManyStreams { retry_after_secs: u64 },
    #[error("no such chat job")]
    JobNotFound,
    #[error("internal error: {0}")]
    Internal(String),
    #[error("missing or wrong bearer token")]
    Unauthorized,
    #[error("{0}")]
    BadIdentity(&'static str),
    #[error("requests from this address are not allowed")]
    ForbiddenSource,
    #[error("no such item")]
    NotFound,
    #[error("the admin API is off")]
    AdminDisabled,
    #[error("{0}")]
    DeskRefused(#[from] crate::desk::Refused),
}

impl ApiError {
    /// The snake_case code clients (and metrics) key on.
    pub fn code(&self) -> &'static str {
        self.parts().1
    }

    /// Status, code and the message a client sees.
    fn parts(&self) -> (StatusCode, &'static str, String) {
        match self {
            ApiError::BadSignature(r) => (StatusCode::UNAUTHORIZED, "bad_signature", r.to_string()),
            ApiError::DeskRefused(r) => (StatusCode::UNAUTHORIZED, "bad_signature", r.to_string()),
            ApiError::VerificationRefused => (
                StatusCode::FORBIDDEN,
                "verification_refused",
                self.to_string(),
            ),
            ApiError::NotJson(e) => (StatusCode::BAD_REQUEST, "not_json", e.to_string()),
            ApiError::TooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                self.to_string(),
            ),
            ApiError::BodyTimeout => (
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                self.to_string(),
            ),
            ApiError::LargeBodiesBusy => (
                StatusCode::SERVICE_UNAVAILABLE,
                "large_bodies_busy",
                "Too many large requests are arriving at once; retry later.".into(),
            ),
            ApiError::AddressBodiesBusy => (
                StatusCode::SERVICE_UNAVAILABLE,
                "address_bodies_busy",
                "Too many requests from this address are arriving at once; retry later.".into(),
            ),
            ApiError::UnreadableBody(_) => {
                (StatusCode::BAD_REQUEST, "unreadable_body", self.to_string())
            }
            // 404, as for a path that does not exist: nothing is there to be allowed to. The
            // message says what a person who expected it must set.
            ApiError::AdminDisabled => (
                StatusCode::NOT_FOUND,
                "admin_disabled",
                "The admin API and the review desk are off: set admin.token \
                 (SABI_ADMIN_TOKEN), at least 16 characters, and restart to turn them on."
                    .into(),
            ),
            ApiError::Store(store::Error::NotFound) | ApiError::NotFound => {
                (StatusCode::NOT_FOUND, "not_found", "No such item.".into())
            }
            ApiError::Store(busy @ store::Error::Busy(_)) => {
                (StatusCode::CONFLICT, "busy", busy.to_string())
            }
            ApiError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "A valid bearer token is required.".into(),
            ),
            ApiError::BadIdentity(why) => (StatusCode::UNAUTHORIZED, "bad_identity", (*why).into()),
            ApiError::ForbiddenSource => {
                (StatusCode::FORBIDDEN, "forbidden_source", self.to_string())
            }
            ApiError::Store(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "the message could not be stored; retry later".into(),
            ),
            ApiError::BadRequest(why) => (StatusCode::BAD_REQUEST, "bad_request", why.clone()),
            ApiError::Invalid { .. } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_field",
                self.to_string(),
            ),
            ApiError::Busy => (
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                "We are answering many questions right now. Please try again in a moment.".into(),
            ),
            ApiError::NotYourSession => (
                StatusCode::FORBIDDEN,
                "not_your_session",
                "This chat belongs to a signed-in user: start a new chat.".into(),
            ),
            ApiError::TooFast { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_requests",
                "You are sending messages very fast. Please wait a moment and try again.".into(),
            ),
            ApiError::AddressLimited { rule, .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                rule.code(),
                rule.message().into(),
            ),
            ApiError::TooManyStreams { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_streams",
                "Too many open answer streams from here; the page asks for its answer instead."
                    .into(),
            ),
            // One body for unknown, expired and other sessions' jobs: it says nothing of which.
            ApiError::JobNotFound => (
                StatusCode::NOT_FOUND,
                "not_found",
                "No such chat job.".into(),
            ),
            ApiError::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Something went wrong on our side; please try again.".into(),
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code, message) = self.parts();
        // Refusals under load are the node working as meant: only failures are errors.
        if matches!(self, ApiError::Internal(_))
            || matches!(&self, ApiError::Store(e) if !matches!(e, store::Error::Busy(_)))
        {
            tracing::error!(error.message = %self, error.cause_chain = ?self, code, "request failed");
        } else {
            tracing::debug!(error.message = %self, code, "request refused");
        }
        let mut response =
            (status, Json(json!({ "code": code, "message": message }))).into_response();
        // Every 429 says the real wait: when the bucket, the session's minute or the oldest
        // stream lets one more in.
        let retry_after = match &self {
            ApiError::AddressLimited {
                retry_after_secs, ..
            }
            | ApiError::TooFast { retry_after_secs }
            | ApiError::TooManyStreams { retry_after_secs } => {
                Some(HeaderValue::from((*retry_after_secs).max(1)))
            }
            _ if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::CONFLICT => {
                Some(HeaderValue::from_static(RETRY_AFTER_SECS))
            }
            _ => None,
        };
        if let Some(value) = retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        response
    }
}

/// What one client address did too often.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressRule {
    Questions,
    NewSessions,
    Handoffs,
}

impl AddressRule {
    fn noun(self) -> &'static str {
        match self {
            AddressRule::Questions => "questions",
            AddressRule::NewSessions => "new sessions",
            AddressRule::Handoffs => "requests for a person",
        }
    }

    fn code(self) -> &'static str {
        match self {
            AddressRule::Questions => "too_many_requests",
            AddressRule::NewSessions => "too_many_sessions",
            AddressRule::Handoffs => "handoff_pending",
        }
    }

    fn message(self) -> &'static str {
        match self {
            AddressRule::Questions => {
                "Many messages are coming from your network. Please wait a moment and try again."
            }
            AddressRule::NewSessions => {
                "Many new chats are starting from your network. Please continue in an open chat, or try again later."
            }
            AddressRule::Handoffs => {
                "A person already has requests from your network and will answer in that chat. Please try again later."
            }
        }
    }
}
