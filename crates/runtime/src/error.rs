//! What a service's error carries besides its class: a message (the contexts it passed
//! through, outermost first) and the cause it began with, kept so that whatever reads the
//! chain (the Kafka producer, which renews itself after a refusal) still finds it. Each
//! service's error enum (`CenterError`, `WorkerError`, `EtlError`) classes it.

use std::error::Error as StdError;
use std::fmt::{self, Display};

type Cause = Box<dyn StdError + Send + Sync + 'static>;

/// A failure's message (its contexts, outermost first) and its cause.
#[derive(Debug)]
pub struct Failure {
    message: String,
    cause: Option<Cause>,
}

impl Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cause {
            Some(cause) if self.message.is_empty() => write!(f, "{cause}"),
            Some(cause) => write!(f, "{}: {cause}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl StdError for Failure {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.cause
            .as_deref()
            .map(|c| c as &(dyn StdError + 'static))
    }
}

impl Failure {
    pub fn of(cause: impl StdError + Send + Sync + 'static) -> Failure {
        Failure {
            message: String::new(),
            cause: Some(Box::new(cause)),
        }
    }

    pub fn message(message: impl Display) -> Failure {
        Failure {
            message: message.to_string(),
            cause: None,
        }
    }

    pub fn within(self, context: impl Display) -> Failure {
        let message = if self.message.is_empty() {
            context.to_string()
        } else {
            format!("{context}: {}", self.message)
        };
        Failure { message, ..self }
    }
}

/// Defines `Context` for a service's error type `$error`: `anyhow`-style context on any
/// `Result` whose error converts into `$error`, the class kept (`$error::context` prefixes
/// the message), and on `Option`, where a missing value is definite (`$error::definite`):
/// looking again finds the same absence. One definition for the three services.
#[macro_export]
macro_rules! error_context {
    ($error:ident) => {
        /// `anyhow`-style context for any error this service classes.
        pub trait Context<T> {
            fn context(self, context: impl std::fmt::Display) -> Result<T, $error>;
            fn with_context<C: std::fmt::Display>(
                self,
                context: impl FnOnce() -> C,
            ) -> Result<T, $error>;
        }

        impl<T, E: Into<$error>> Context<T> for Result<T, E> {
            fn context(self, context: impl std::fmt::Display) -> Result<T, $error> {
                self.map_err(|e| e.into().context(context))
            }

            fn with_context<C: std::fmt::Display>(
                self,
                context: impl FnOnce() -> C,
            ) -> Result<T, $error> {
                self.map_err(|e| e.into().context(context()))
            }
        }

        impl<T> Context<T> for Option<T> {
            fn context(self, context: impl std::fmt::Display) -> Result<T, $error> {
                self.ok_or_else(|| $error::definite(context))
            }

            fn with_context<C: std::fmt::Display>(
                self,
                context: impl FnOnce() -> C,
            ) -> Result<T, $error> {
                self.ok_or_else(|| $error::definite(context()))
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_nest_outermost_first_and_the_cause_stays() {
        let io = std::io::Error::other("refused");
        let f = Failure::of(io).within("table t").within("build job p~plan");
        assert_eq!(f.to_string(), "build job p~plan: table t: refused");
        let cause = f.source().expect("kept");
        assert!(cause.downcast_ref::<std::io::Error>().is_some());
        assert_eq!(
            Failure::message("gone").within("source s").to_string(),
            "source s: gone"
        );
    }
}
