//! The web console as a test reaches it over HTTP: logins, sessions and calls, the cookie
//! kept by hand.

use reqwest::header;
use reqwest::StatusCode;
use serde_json::{json, Value};

/// A browser's view of one console: its cookie kept by hand.
pub struct Browser {
    pub http: reqwest::Client,
    pub url: String,
}

impl Browser {
    pub async fn post(
        &self,
        path: &str,
        cookie: Option<&str>,
        csrf: Option<&str>,
        body: Value,
    ) -> reqwest::Response {
        let mut req = self.http.post(format!("{}{path}", self.url)).json(&body);
        if let Some(c) = cookie {
            req = req.header(header::COOKIE, format!("sluice_session={c}"));
        }
        if let Some(t) = csrf {
            req = req.header("x-csrf-token", t);
        }
        req.send().await.expect("the console answers")
    }

    /// Logs in; the session cookie's value and the CSRF token.
    pub async fn login(
        &self,
        planted: Option<&str>,
        user: &str,
        password: &str,
    ) -> (String, String) {
        let r = self
            .post(
                "/login",
                planted,
                None,
                json!({"user": user, "password": password}),
            )
            .await;
        assert_eq!(r.status(), StatusCode::OK, "login of {user}");
        let set = r
            .headers()
            .get(header::SET_COOKIE)
            .and_then(|v| v.to_str().ok())
            .expect("a session cookie")
            .to_owned();
        for flag in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/"] {
            assert!(set.contains(flag), "the cookie is {flag}: {set}");
        }
        let value = set
            .split(';')
            .next()
            .and_then(|kv| kv.strip_prefix("sluice_session="))
            .expect("the cookie's value")
            .to_owned();
        let body: Value = r.json().await.unwrap();
        (value, body["csrf"].as_str().unwrap().to_owned())
    }

    pub async fn session_status(&self, cookie: &str) -> StatusCode {
        self.http
            .get(format!("{}/session", self.url))
            .header(header::COOKIE, format!("sluice_session={cookie}"))
            .send()
            .await
            .unwrap()
            .status()
    }
}
