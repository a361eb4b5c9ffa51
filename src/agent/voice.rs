//! Voice notes to text, before the router and the agent read the batch.
//!
//! An audio message is looked up and downloaded through the Graph API at once (its URL
//! expires within minutes), within a size limit, and transcribed through an OpenAI-compatible
//! `/audio/transcriptions` endpoint; the transcript takes the message's place as text. Images
//! and documents already carry their captions as text. When a voice note cannot be heard, the
//! customer is asked kindly to type instead: never silence.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use secrecy::{ExposeSecret, SecretString};

use crate::domain::{Batch, ReplyPart};
use crate::sender::graph::Graph;
use crate::worker::{TurnError, TurnHandler, TurnOutcome};

/// What the customer is told when their voice note could not be transcribed.
pub const CANNOT_LISTEN: &str =
    "Sorry, we could not listen to your voice note. Could you type your message, please?";

/// Where speech becomes text.
#[derive(Debug, Clone)]
pub struct Transcriber {
    pub base_url: String,
    pub api_key: Option<SecretString>,
    pub model: String,
    pub max_bytes: u64,
    pub timeout: Duration,
}

pub struct VoiceNotes {
    inner: Arc<dyn TurnHandler>,
    graph: Graph,
    transcriber: Transcriber,
    http: reqwest::Client,
}

impl VoiceNotes {
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(
        inner: Arc<dyn TurnHandler>,
        graph: Graph,
        transcriber: Transcriber,
    ) -> reqwest::Result<Arc<VoiceNotes>> {
        let http = reqwest::Client::builder()
            .timeout(transcriber.timeout)
            .build()?;
        Ok(Arc::new(VoiceNotes {
            inner,
            graph,
            transcriber,
            http,
        }))
    }

    async fn transcribe(&self, media_id: &str) -> Result<String, String> {
        let media = self
            .graph
            .media(media_id)
            .await
            .map_err(|e| e.to_string())?;
        let audio = self
            .graph
            .download(&media.url, self.transcriber.max_bytes)
            .await
            .map_err(|e| e.to_string())?;
        let file = reqwest::multipart::Part::bytes(audio)
            .file_name("voice.ogg")
            .mime_str(if media.mime_type.is_empty() {
                "audio/ogg"
            } else {
                &media.mime_type
            })
            .map_err(|e| e.to_string())?;
        let form = reqwest::multipart::Form::new()
            .text("model", self.transcriber.model.clone())
            .part("file", file);
        let url = format!(
            "{}/audio/transcriptions",
            self.transcriber.base_url.trim_end_matches('/')
        );
        let mut request = self.http.post(url).multipart(form);
        if let Some(key) = &self.transcriber.api_key {
            request = request.bearer_auth(key.expose_secret());
        }
        let response = request.send().await.map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("transcription answered {}", response.status()));
        }
        #[derive(serde::Deserialize)]
        struct Answer {
            text: String,
        }
        let answer: Answer = response.json().await.map_err(|e| e.to_string())?;
        let text = answer.text.trim().to_owned();
        if text.is_empty() {
            return Err("empty transcript".into());
        }
        Ok(text)
    }
}

#[async_trait]
impl TurnHandler for VoiceNotes {
    async fn handle(&self, batch: &Batch) -> Result<TurnOutcome, TurnError> {
        let voice = |m: &crate::domain::BatchMessage| {
            m.item_type.as_deref() == Some("audio") && m.media_id.is_some() && m.text.is_none()
        };
        if !batch.messages.iter().any(voice) {
            return self.inner.handle(batch).await;
        }
        let mut heard = batch.clone();
        for message in heard.messages.iter_mut().filter(|m| voice(m)) {
            let media_id = message.media_id.clone().unwrap_or_default();
            match self.transcribe(&media_id).await {
                Ok(text) => message.text = Some(text),
                Err(e) => {
                    tracing::warn!(batch = batch.id, error.message = %e, "voice note not transcribed");
                    return Ok(TurnOutcome::Reply(vec![ReplyPart::text(CANNOT_LISTEN)]));
                }
            }
        }
        self.inner.handle(&heard).await
    }
}
