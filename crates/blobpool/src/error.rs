//! The configuration's error: which setting was wrong, where its value came
//! from, and why. Its `Display` is the one-line message the command line
//! prints (`config file PATH:LINE:COL: key: …`, `environment BLOBPOOL_…:
//! …`, `flag --…: …`).

/// Where a setting's value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The config file: `PATH:LINE:COL: key` (or `PATH: [section]` for a
    /// whole section, or `PATH:LINE:COL` for a syntax error).
    File(String),
    /// An environment variable, by name.
    Env(String),
    /// A command-line flag, as written (`--kv`).
    Flag(String),
    /// The built-in default.
    Default,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Origin::File(at) => write!(f, "config file {at}"),
            Origin::Env(name) => write!(f, "environment {name}"),
            Origin::Flag(name) => write!(f, "flag {name}"),
            Origin::Default => f.write_str("the default"),
        }
    }
}

impl Origin {
    /// The error of the setting `key` whose value from here is invalid.
    pub fn err(&self, key: &str, reason: impl Into<Invalid>) -> ConfigError {
        ConfigError::Value {
            origin: self.clone(),
            key: key.to_string(),
            reason: reason.into(),
        }
    }
}

/// Why a value is not valid, before anyone knows where it came from: what
/// a key's parser or check says (`"lots" is not a size …`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

impl From<String> for Invalid {
    fn from(s: String) -> Self {
        Invalid(s)
    }
}

impl From<store_ops::auth::AuthConfigError> for Invalid {
    fn from(e: store_ops::auth::AuthConfigError) -> Self {
        Invalid(e.to_string())
    }
}

impl From<&str> for Invalid {
    fn from(s: &str) -> Self {
        Invalid(s.to_string())
    }
}

/// A configuration error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A setting's value is not valid: where it came from, the setting
    /// (its dotted name, e.g. `gc.namespaces.ci.max_bytes`, or the
    /// variable's name) and why.
    #[error("{origin}: {reason}")]
    Value {
        /// Where the value came from.
        origin: Origin,
        /// The setting.
        key: String,
        /// Why it is not valid.
        reason: Invalid,
    },
    /// A setting is not valid where its origin is not known (the server
    /// sections after the environment was merged over the file, `[gc]`
    /// before its origin is attached): the reason names the setting.
    #[error("{reason}")]
    Setting {
        /// The setting.
        key: String,
        /// Why it is not valid (names the setting).
        reason: Invalid,
    },
    /// The config file cannot be read.
    #[error("cannot read config file {path}: {source}")]
    Unreadable {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl ConfigError {
    /// A [`ConfigError::Setting`].
    pub fn setting(key: impl Into<String>, reason: impl Into<Invalid>) -> Self {
        ConfigError::Setting {
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// The setting, when one is known.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Value { key, .. } | ConfigError::Setting { key, .. } => Some(key),
            ConfigError::Unreadable { .. } => None,
        }
    }

    /// This error with `origin` attached: a [`ConfigError::Setting`]
    /// becomes a [`ConfigError::Value`] from `origin`; any other is kept.
    pub fn from_origin(self, origin: &Origin) -> Self {
        match self {
            ConfigError::Setting { key, reason } => ConfigError::Value {
                origin: origin.clone(),
                key,
                reason,
            },
            other => other,
        }
    }
}
