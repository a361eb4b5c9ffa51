//! Voice notes to text, before the router and the agent read the batch.
//!
//! An audio message is looked up and downloaded through the Graph API at once (its URL
//! expires within minutes), within a size limit, and transcribed through an OpenAI-compatible
//! `/audio/transcriptions` endpoint, all of a batch's notes at once; each transcript takes its
//! message's place as text. Images and documents already carry their captions as text. When a
//! batch is only voice notes and one cannot be heard (or Sabi cannot fetch media: sandbox mode,
//! no transcription configured), the customer is asked kindly to type instead: never silence.
//! In a batch with typed text, an unheard note is marked as such and the rest is answered.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use secrecy::{ExposeSecret, SecretString};

use futures_util::future::join_all;

use crate::domain::{Batch, BatchMessage, ReplyPart};
use crate::store::Turns;
use crate::turn::{TurnError, TurnHandler, TurnOutcome};
use crate::whatsapp::graph::Graph;

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
    /// The notes' language (ISO-639-1); `None`: the server detects it.
    pub language: Option<String>,
    /// Words to bias the transcription towards (Whisper's `prompt`).
    pub prompt: Option<String>,
}

/// What stands in for a voice note that could not be heard, beside typed messages.
const UNHEARD: &str = "[a voice note that could not be transcribed]";

pub struct VoiceNotes {
    inner: Arc<dyn TurnHandler>,
    /// Where transcripts are kept, as the notes' text.
    store: Arc<dyn Turns>,
    /// Without a Graph client (sandbox mode) or a transcriber, no note can be heard.
    hearing: Option<(Graph, Transcriber)>,
    http: reqwest::Client,
}

impl VoiceNotes {
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(
        inner: Arc<dyn TurnHandler>,
        store: Arc<dyn Turns>,
        hearing: Option<(Graph, Transcriber)>,
    ) -> reqwest::Result<Arc<VoiceNotes>> {
        let timeout = hearing
            .as_ref()
            .map_or(Duration::from_secs(30), |(_, t)| t.timeout);
        let http = reqwest::Client::builder().timeout(timeout).build()?;
        Ok(Arc::new(VoiceNotes {
            inner,
            store,
            hearing,
            http,
        }))
    }

    async fn transcribe(&self, media_id: &str) -> Result<String, String> {
        let Some((graph, transcriber)) = &self.hearing else {
            return Err(
                "voice notes cannot be fetched here (sandbox mode, or no transcription configured)"
                    .into(),
            );
        };
        let media = graph.media(media_id).await.map_err(|e| e.to_string())?;
        let audio = graph
            .download(&media.url, transcriber.max_bytes)
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
        let mut form = reqwest::multipart::Form::new()
            .text("model", transcriber.model.clone())
            .part("file", file);
        for (name, value) in [
            ("language", &transcriber.language),
            ("prompt", &transcriber.prompt),
        ] {
            if let Some(value) = value {
                form = form.text(name, value.clone());
            }
        }
        let url = format!(
            "{}/audio/transcriptions",
            transcriber.base_url.trim_end_matches('/')
        );
        let mut request = self.http.post(url).multipart(form);
        if let Some(key) = &transcriber.api_key {
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
        let voice = |m: &BatchMessage| {
            m.item_type.as_deref() == Some("audio") && m.media_id.is_some() && m.text.is_none()
        };
        if !batch.messages.iter().any(voice) {
            return self.inner.handle(batch).await;
        }
        let mut heard = batch.clone();
        let notes: Vec<&mut BatchMessage> =
            heard.messages.iter_mut().filter(|m| voice(m)).collect();
        let transcripts = join_all(
            notes
                .iter()
                .map(|m| self.transcribe(m.media_id.as_deref().unwrap_or_default())),
        )
        .await;
        let mut unheard = 0;
        for (message, transcript) in notes.into_iter().zip(transcripts) {
            match transcript {
                Ok(text) => {
                    let kept = self
                        .store
                        .set_transcript(batch.conversation.channel, &message.external_id, &text)
                        .await;
                    if let Err(e) = kept {
                        tracing::warn!(error.message = %e, "could not keep a transcript");
                    }
                    message.text = Some(text);
                }
                Err(e) => {
                    tracing::warn!(batch = batch.id, error.message = %e, "voice note not transcribed");
                    message.text = Some(UNHEARD.into());
                    unheard += 1;
                }
            }
        }
        let typed = heard
            .messages
            .iter()
            .any(|m| m.text.as_deref().is_some_and(|t| t != UNHEARD));
        if unheard > 0 && !typed {
            return Ok(TurnOutcome::Reply(vec![ReplyPart::text(CANNOT_LISTEN)]));
        }
        self.inner.handle(&heard).await
    }
}
