//! Iceberg tables found through a REST catalog (the Iceberg REST catalog specification, as
//! Polaris, Nessie, Unity, Glue's REST endpoint and pyiceberg's `load_catalog(type="rest")`
//! speak it): SOURCE `iceberg:NAMESPACE.TABLE`, the catalog's URI and credentials as mount
//! options. The catalog is asked once, when the dataset is read, for the table's metadata
//! location (its `config` call, then its load-table call); the table is then read at that
//! metadata file as any Iceberg table named by one (PRODUCT.md §8), with the store settings the
//! catalog hands out for it where the mount's options give none.
//!
//! Options (`iceberg_…`, kept among the store options so that secrets stay masked):
//! `iceberg_uri=URL` (required), `iceberg_warehouse=NAME`, `iceberg_token=T` (a bearer token)
//! or `iceberg_credential=CLIENT_ID:SECRET` (OAuth2 client credentials, exchanged at the
//! catalog's `v1/oauth/tokens`, with `iceberg_scope=`, default `catalog`, as pyiceberg's).

use anyhow::{Context, Result, anyhow, bail};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

/// How a SOURCE names a table of a REST catalog.
pub(crate) const SCHEME: &str = "iceberg:";
/// The prefix of the catalog's options.
pub(crate) const PREFIX: &str = "iceberg_";

/// A table the catalog located: its metadata file, and the store options to read it with.
pub(crate) struct Located {
    pub(crate) metadata: String,
    pub(crate) store: Vec<(String, String)>,
}

fn option<'a>(options: &'a [(String, String)], key: &str) -> Option<&'a str> {
    (options.iter())
        .rfind(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty())
}

fn enc(s: &str) -> String {
    utf8_percent_encode(s, NON_ALPHANUMERIC).to_string()
}

/// The store options without the catalog's: what the stores themselves take.
pub(crate) fn store_options(options: &[(String, String)]) -> Vec<(String, String)> {
    (options.iter())
        .filter(|(k, _)| !k.starts_with(PREFIX))
        .cloned()
        .collect()
}

/// Where `source` is read from: the metadata file a catalog names for an `iceberg:` SOURCE,
/// else the source itself; and the store options for it.
pub(crate) async fn resolve(
    source: &str,
    options: &[(String, String)],
) -> Result<(String, Vec<(String, String)>)> {
    match source.strip_prefix(SCHEME) {
        Some(name) => {
            let located = locate(source, name, options).await?;
            Ok((located.metadata, located.store))
        }
        None => {
            if let Some((k, _)) = options.iter().find(|(k, _)| k.starts_with(PREFIX)) {
                bail!(
                    "mount option {k}= is for a table of an Iceberg REST catalog, named as SOURCE iceberg:NAMESPACE.TABLE, and source '{source}' is none"
                );
            }
            Ok((source.to_string(), options.to_vec()))
        }
    }
}

/// Asks the catalog where table `name` (`NAMESPACE.TABLE`, the namespace's levels joined by
/// dots) is.
async fn locate(source: &str, name: &str, options: &[(String, String)]) -> Result<Located> {
    let Some((namespace, table)) = name.rsplit_once('.') else {
        bail!("source '{source}' names no table: iceberg:NAMESPACE.TABLE, as iceberg:db.events");
    };
    let Some(uri) = option(options, "iceberg_uri") else {
        bail!(
            "source '{source}' is a table of an Iceberg REST catalog: give the catalog's URI with -o iceberg_uri=URL"
        );
    };
    let uri = uri.trim_end_matches('/').to_string();
    crate::source::install_tls_provider();
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .context("an HTTP client")?;
    let failed = |what: &str, e: anyhow::Error| {
        anyhow!(
            "Iceberg REST catalog at {uri}: {what}: {}",
            crate::describe(&e)
        )
    };
    let token = match (
        option(options, "iceberg_token"),
        option(options, "iceberg_credential"),
    ) {
        (Some(t), _) => Some(t.to_string()),
        (None, Some(credential)) => Some(
            oauth_token(&client, &uri, credential, option(options, "iceberg_scope"))
                .await
                .map_err(|e| failed("its OAuth2 token", e))?,
        ),
        (None, None) => None,
    };
    let get = |url: String| {
        let mut request = client.get(url);
        if let Some(t) = &token {
            request = request.bearer_auth(t);
        }
        request.send()
    };
    let mut config_url = format!("{uri}/v1/config");
    if let Some(w) = option(options, "iceberg_warehouse") {
        config_url.push_str(&format!("?warehouse={}", enc(w)));
    }
    let config = answer(get(config_url).await)
        .await
        .map_err(|e| failed("its config", e))?;
    // The catalog's overrides win over the client's settings, as the specification says.
    let setting = |k: &str| {
        (config.get("overrides").and_then(|o| o.get(k)))
            .or_else(|| config.get("defaults").and_then(|d| d.get(k)))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let base = setting("uri").unwrap_or(uri.clone());
    let base = base.trim_end_matches('/');
    let prefix = setting("prefix")
        .map(|p| format!("{}/", p.trim_matches('/')))
        .unwrap_or_default();
    // A multi-level namespace's levels are joined by the unit separator, 0x1F.
    let levels: Vec<String> = namespace.split('.').map(enc).collect();
    let url = format!(
        "{base}/v1/{prefix}namespaces/{}/tables/{}",
        levels.join("%1F"),
        enc(table)
    );
    let loaded = answer(get(url).await)
        .await
        .map_err(|e| failed(&format!("table {name}"), e))?;
    let metadata = (loaded.get("metadata-location").and_then(Value::as_str))
        .ok_or_else(|| {
            failed(
                &format!("table {name}"),
                anyhow!("it names no metadata-location"),
            )
        })?
        .to_string();
    let mut store = store_options(options);
    let table_config = loaded.get("config").and_then(Value::as_object);
    let given = |k: &str, store: &[(String, String)]| store.iter().any(|(key, _)| key == k);
    for (from, to) in [
        ("s3.endpoint", "aws_endpoint"),
        ("s3.access-key-id", "aws_access_key_id"),
        ("s3.secret-access-key", "aws_secret_access_key"),
        ("s3.session-token", "aws_session_token"),
        ("s3.region", "aws_region"),
        ("client.region", "aws_region"),
    ] {
        let value = (table_config.and_then(|c| c.get(from)))
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| setting(from));
        if let Some(v) = value
            && !given(to, &store)
        {
            if to == "aws_endpoint" && v.starts_with("http://") && !given("aws_allow_http", &store)
            {
                store.push(("aws_allow_http".into(), "true".into()));
            }
            store.push((to.into(), v));
        }
    }
    Ok(Located { metadata, store })
}

/// An OAuth2 client-credentials token from the catalog (`CLIENT_ID:SECRET`, or a secret alone).
async fn oauth_token(
    client: &reqwest::Client,
    uri: &str,
    credential: &str,
    scope: Option<&str>,
) -> Result<String> {
    let (id, secret) = credential.split_once(':').unwrap_or(("", credential));
    let mut body = format!(
        "grant_type=client_credentials&client_secret={}&scope={}",
        enc(secret),
        enc(scope.unwrap_or("catalog"))
    );
    if !id.is_empty() {
        body.push_str(&format!("&client_id={}", enc(id)));
    }
    let response = client
        .post(format!("{uri}/v1/oauth/tokens"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await;
    let token = answer(response).await?;
    (token.get("access_token").and_then(Value::as_str))
        .map(str::to_string)
        .context("the answer holds no access_token")
}

/// A catalog's JSON answer, or its error in one line (the specification's error model:
/// `{"error": {"message", "type", "code"}}`).
async fn answer(response: reqwest::Result<reqwest::Response>) -> Result<Value> {
    let response = response.map_err(|e| anyhow!("{e}"))?;
    let status = response.status();
    let bytes = response.bytes().await.map_err(|e| anyhow!("{e}"))?;
    let json: Option<Value> = serde_json::from_slice(&bytes).ok();
    if !status.is_success() {
        let error = json.as_ref().and_then(|j| j.get("error"));
        let field = |k: &str| error.and_then(|e| e.get(k)).and_then(Value::as_str);
        bail!(
            "HTTP {}{}",
            status.as_u16(),
            match (field("type"), field("message")) {
                (Some(t), Some(m)) => format!(": {t}: {m}"),
                (None, Some(m)) => format!(": {m}"),
                _ => String::new(),
            }
        );
    }
    json.context("its answer is not JSON")
}
