//! The object stores a source is read from: SOURCE as a URL, the store it names, configured from
//! the environment, the mount's object_store keys, the AWS CLI's profiles and tensorfs's own
//! HTTP credentials, with the retries every remote request gets.

use crate::source::{aws_profile, iceberg_rest};
use anyhow::{Result, anyhow, bail};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::http::HttpBuilder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientConfigKey, ClientOptions, ObjectStore, ObjectStoreScheme, RetryConfig,
};
use std::sync::Arc;
use std::time::Duration;
use url::Url;

/// Turns SOURCE (a URL or a local path) into a URL object_store understands.
pub(crate) fn source_url(source: &str) -> Result<Url> {
    if source.contains("://") {
        let mut url =
            Url::parse(source).map_err(|e| anyhow!("source '{source}' is not a valid URL: {e}"))?;
        if !url.username().is_empty() || url.password().is_some() {
            // Never shown: the refusal names the URL with its password masked.
            if url.password().is_some() {
                let _ = url.set_password(Some("****"));
            }
            bail!(
                "source '{url}': tensorfs takes no user name or password in a URL; give them as mount options (http_username=, http_password=) or in the environment"
            );
        }
        return Ok(url);
    }
    let path = std::fs::canonicalize(source)
        .map_err(|e| anyhow!("source '{source}' cannot be opened: {}", io_reason(&e)))?;
    let mut url = Url::from_file_path(&path)
        .map_err(|_| anyhow!("source '{source}' is not a usable path"))?;
    if path.is_dir() && !url.path().ends_with('/') {
        url.set_path(&format!("{}/", url.path()));
    }
    Ok(url)
}

/// The store and object path a URL names (a snapshot's), configured as a source's store is.
pub(crate) fn store_of(
    url: &str,
    store_options: &[(String, String)],
) -> Result<(Arc<dyn ObjectStore>, Path)> {
    open_store(&source_url(url)?, store_options)
}

/// Retries of remote requests: 5xx, throttling, resets and timeouts are retried with
/// exponential backoff and jitter (object_store's) for up to a minute, so a server that stays
/// down turns into EIO rather than a hung read, and a request that timed out is still retried.
fn retry() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(4),
            base: 2.0,
        },
        max_retries: 10,
        retry_timeout: Duration::from_secs(60),
    }
}

/// Client defaults, as configuration keys so that the environment's and the mount's own keys
/// (`aws_allow_http`, `aws_timeout`, …) still apply over them.
const CLIENT_DEFAULTS: [(ClientConfigKey, &str); 2] = [
    (ClientConfigKey::ConnectTimeout, "5s"),
    (ClientConfigKey::Timeout, "15s"),
];

fn bad_key(key: &str) -> anyhow::Error {
    anyhow!("unknown mount option '{key}' for this kind of source")
}

/// Builds a cloud store: environment, then our client defaults, then the mount's keys.
macro_rules! cloud_store {
    ($builder:ty, $client_key:path, $url:expr, $options:expr) => {{
        let mut b = <$builder>::from_env()
            .with_url($url.as_str())
            .with_retry(retry());
        for (key, value) in CLIENT_DEFAULTS {
            b = b.with_config($client_key(key), value);
        }
        for (k, v) in $options {
            b = b.with_config(k.parse().map_err(|_| bad_key(k))?, v);
        }
        Arc::new(b.build()?) as Arc<dyn ObjectStore>
    }};
}

/// The object store for a URL, configured from the environment (`AWS_*`, `GOOGLE_*`,
/// `AZURE_*`) and from the object_store keys among the mount options.
/// Installs ring as rustls's crypto provider, once, before the first TLS client is built (the
/// HTTP client is built without one of its own, see Cargo.toml).
pub(crate) fn install_tls_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // An error means a provider is installed already, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

pub(crate) fn open_store(
    url: &Url,
    options: &[(String, String)],
) -> Result<(Arc<dyn ObjectStore>, Path)> {
    install_tls_provider();
    // A REST catalog's options are the catalog's, not the store's (iceberg_rest).
    let options = &iceberg_rest::store_options(options)[..];
    let (scheme, path) = ObjectStoreScheme::parse(url)?;
    let store: Arc<dyn ObjectStore> = match scheme {
        ObjectStoreScheme::Local => {
            if let Some((k, _)) = options.first() {
                return Err(bad_key(k));
            }
            Arc::new(LocalFileSystem::new())
        }
        ObjectStoreScheme::AmazonS3 => {
            // The AWS CLI's profile (aws_profile=, AWS_PROFILE) is no object_store key.
            let profile = (options.iter())
                .rfind(|(k, _)| k == aws_profile::OPTION)
                .map(|(_, v)| v.as_str());
            let rest: Vec<(String, String)> = (options.iter())
                .filter(|(k, _)| k != aws_profile::OPTION)
                .cloned()
                .collect();
            let mut b = AmazonS3Builder::from_env()
                .with_url(url.as_str())
                .with_retry(retry());
            for (key, value) in CLIENT_DEFAULTS {
                b = b.with_config(AmazonS3ConfigKey::Client(key), value);
            }
            for (k, v) in &rest {
                b = b.with_config(k.parse().map_err(|_| bad_key(k))?, v);
            }
            Arc::new(aws_profile::apply(b, profile)?.build()?) as Arc<dyn ObjectStore>
        }
        ObjectStoreScheme::GoogleCloudStorage => {
            cloud_store!(
                GoogleCloudStorageBuilder,
                GoogleConfigKey::Client,
                url,
                options
            )
        }
        ObjectStoreScheme::MicrosoftAzure => {
            let mut b = MicrosoftAzureBuilder::from_env()
                .with_url(url.as_str())
                .with_retry(retry());
            for (key, value) in CLIENT_DEFAULTS {
                b = b.with_config(AzureConfigKey::Client(key), value);
            }
            for (k, v) in options {
                b = b.with_config(k.parse().map_err(|_| bad_key(k))?, v);
            }
            if azure_cli_unless_given(&b, azure_login_dir().as_deref(), options) {
                b = b.with_use_azure_cli(true);
            }
            Arc::new(b.build()?) as Arc<dyn ObjectStore>
        }
        ObjectStoreScheme::Http => {
            let mut client = ClientOptions::new();
            for (key, value) in CLIENT_DEFAULTS {
                client = client.with_config(key, value);
            }
            if let Some(header) = http_credentials(options)? {
                let mut headers = reqwest::header::HeaderMap::new();
                headers.insert(reqwest::header::AUTHORIZATION, header);
                client = client.with_default_headers(headers);
            }
            let client_keys = options
                .iter()
                .filter(|(k, _)| !HTTP_CREDENTIAL_KEYS.contains(&k.as_str()));
            for (k, v) in client_keys {
                let key = k
                    .strip_prefix("http_")
                    .or_else(|| k.strip_prefix("client_"))
                    .unwrap_or(k);
                client = client.with_config(key.parse().map_err(|_| bad_key(k))?, v);
            }
            let origin = &url[..url::Position::BeforePath];
            Arc::new(
                HttpBuilder::new()
                    .with_url(origin)
                    .with_retry(retry())
                    .with_client_options(client)
                    .build()?,
            )
        }
        other => bail!("{other:?} sources are not supported"),
    };
    Ok((store, Path::parse(path)?))
}

/// Whether an Azure store given no credential of its own (no key, SAS, token, client secret,
/// federated token, managed identity endpoint or emulator, in the options or the environment)
/// takes the Azure CLI's login (`az login`: its profile in `AZURE_CONFIG_DIR`, else
/// `~/.azure/`), as Azure's own tools do, rather than asking instance metadata. An explicit
/// `azure_use_azure_cli=false` keeps managed identity.
fn azure_cli_unless_given(
    b: &MicrosoftAzureBuilder,
    login: Option<&std::path::Path>,
    options: &[(String, String)],
) -> bool {
    use AzureConfigKey as K;
    let given = [
        K::AccessKey,
        K::SasKey,
        K::Token,
        K::ClientSecret,
        K::FederatedTokenFile,
        K::MsiEndpoint,
        K::ObjectId,
        K::MsiResourceId,
        K::UseEmulator,
        K::SkipSignature,
        K::UseFabricEndpoint,
    ];
    if given.iter().any(|k| {
        b.get_config_value(k)
            .is_some_and(|v| !v.is_empty() && v != "false")
    }) {
        return false;
    }
    // Told either way (a builder reads an unset flag as false, so it cannot tell).
    let told = (options.iter()).any(|(k, _)| matches!(k.parse::<K>(), Ok(K::UseAzureCli)))
        || std::env::var_os("AZURE_USE_AZURE_CLI").is_some();
    if told {
        return false;
    }
    let Some(dir) = login else {
        return false;
    };
    // A login leaves the account's subscriptions in the profile.
    std::fs::read_to_string(dir.join("azureProfile.json"))
        .is_ok_and(|profile| profile.contains("\"subscriptions\"") && profile.contains("\"id\""))
}

/// Where the Azure CLI keeps its login: `AZURE_CONFIG_DIR`, else `~/.azure`.
fn azure_login_dir() -> Option<std::path::PathBuf> {
    match std::env::var_os("AZURE_CONFIG_DIR") {
        Some(d) => Some(d.into()),
        None => Some(std::path::PathBuf::from(std::env::var_os("HOME")?).join(".azure")),
    }
}

/// The `Authorization` header an HTTP source sends, and the other options. object_store's HTTP
/// store has no keys for credentials, so tensorfs takes its own: `http_username` with
/// `http_password` (basic), or `http_bearer_token`, from the mount options or else from the
/// environment (`TENSORFS_HTTP_USERNAME`, `TENSORFS_HTTP_PASSWORD`,
/// `TENSORFS_HTTP_BEARER_TOKEN`). The header is marked sensitive, so it is never logged.
fn http_credentials(options: &[(String, String)]) -> Result<Option<reqwest::header::HeaderValue>> {
    use base64::Engine;
    let given = |key: &str| -> Option<String> {
        let from_options = options
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone());
        from_options.or_else(|| std::env::var(format!("TENSORFS_{}", key.to_uppercase())).ok())
    };
    let value = match (
        given("http_username"),
        given("http_password"),
        given("http_bearer_token"),
    ) {
        (None, None, None) => None,
        (Some(user), password, None) => {
            let pair = format!("{user}:{}", password.unwrap_or_default());
            let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
            Some(format!("Basic {encoded}"))
        }
        (None, None, Some(token)) => Some(format!("Bearer {token}")),
        (None, Some(_), None) => bail!("http_password needs http_username"),
        (Some(_), _, Some(_)) | (None, Some(_), Some(_)) => {
            bail!("give http_username and http_password, or http_bearer_token, not both")
        }
    };
    value
        .map(|v| {
            let mut h = reqwest::header::HeaderValue::from_str(&v)
                .map_err(|_| anyhow!("HTTP credentials must be printable ASCII"))?;
            h.set_sensitive(true);
            Ok(h)
        })
        .transpose()
}

/// tensorfs's own keys of an HTTP source (see [`http_credentials`]).
const HTTP_CREDENTIAL_KEYS: [&str; 3] = ["http_username", "http_password", "http_bearer_token"];

/// An I/O error as a refusal says it: the common ones in plain words.
pub(crate) fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_credentials_are_one_sensitive_header() {
        let opts = |kv: &[(&str, &str)]| -> Vec<(String, String)> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let given = opts(&[
            ("http_username", "ada"),
            ("http_password", "s3cr3t"),
            ("client_timeout", "5s"),
        ]);
        let header = http_credentials(&given).unwrap().unwrap();
        // base64("ada:s3cr3t")
        assert_eq!(header.to_str().unwrap(), "Basic YWRhOnMzY3IzdA==");
        assert!(header.is_sensitive());
        let bearer = opts(&[("http_bearer_token", "tok")]);
        assert_eq!(http_credentials(&bearer).unwrap().unwrap(), "Bearer tok");
        let both = opts(&[("http_username", "a"), ("http_bearer_token", "t")]);
        assert!(http_credentials(&both).is_err());
        let half = opts(&[("http_password", "p")]);
        assert!(http_credentials(&half).is_err());
    }

    /// The HTTP client is built without a TLS provider of its own: building an https store
    /// must find ring installed, and a request must fail as a request (nothing listens on
    /// port 9 here), not panic.
    #[tokio::test]
    async fn https_stores_build_with_the_ring_provider() {
        for url in ["https://127.0.0.1:9/data/", "s3://bucket/data/"] {
            let url = Url::parse(url).unwrap();
            let options = match url.scheme() {
                "s3" => vec![
                    (
                        "aws_endpoint".to_string(),
                        "https://127.0.0.1:9".to_string(),
                    ),
                    ("aws_region".to_string(), "us-east-1".to_string()),
                    ("aws_skip_signature".to_string(), "true".to_string()),
                ],
                _ => vec![],
            };
            let (store, prefix) = open_store(&url, &options).expect("the store builds");
            let listed = tokio::time::timeout(
                std::time::Duration::from_secs(120),
                store.list_with_delimiter(Some(&prefix)),
            )
            .await
            .expect("the request ends");
            assert!(listed.is_err(), "{url}: nothing listens there");
        }
    }

    #[test]
    fn an_azure_store_given_nothing_takes_the_cli_s_login() {
        let dir = tempfile::tempdir().unwrap();
        let url = "az://container/prefix";
        let bare = || {
            MicrosoftAzureBuilder::new()
                .with_url(url)
                .with_account("acct")
        };
        let none: &[(String, String)] = &[];
        assert!(
            !azure_cli_unless_given(&bare(), Some(dir.path()), none),
            "no login"
        );
        std::fs::write(
            dir.path().join("azureProfile.json"),
            r#"{"subscriptions": [{"id": "0000", "name": "x"}]}"#,
        )
        .unwrap();
        assert!(azure_cli_unless_given(&bare(), Some(dir.path()), none));
        let keyed = bare().with_access_key("a2V5");
        assert!(
            !azure_cli_unless_given(&keyed, Some(dir.path()), none),
            "a key given"
        );
        let off = [("azure_use_azure_cli".to_string(), "false".to_string())];
        assert!(
            !azure_cli_unless_given(&bare(), Some(dir.path()), &off),
            "told not to"
        );
        let emulated = bare().with_use_emulator(true);
        assert!(
            !azure_cli_unless_given(&emulated, Some(dir.path()), none),
            "the emulator"
        );
    }
}
