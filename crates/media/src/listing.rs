//! The listing, sans-IO: what storage there is and the media on it, as JSON
//! (`/api/media`) and as an HTML page (`/`), and the paths that name a file
//! (`/media/STORAGE/LUN/PATH`) and its player page (`/play/STORAGE/LUN/PATH`).

use serde::Serialize;

use crate::http::{percent_decode, percent_encode_path};
use crate::mime::content_type;

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Listing {
    pub storages: Vec<StorageView>,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct StorageView {
    /// The name in URLs: the target's alias, or its IQN.
    pub id: String,
    pub target: String,
    pub alias: Option<String>,
    pub portal: String,
    /// "isns" or "url".
    pub found_by: String,
    /// "open" (a session is logged in), "closed" (none now; opened on the next request)
    /// or "unreachable".
    pub state: String,
    pub error: Option<String>,
    pub volumes: Vec<VolumeView>,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct VolumeView {
    pub lun: u16,
    /// "ext4" or "fat"; absent when the LUN holds no file system read here.
    pub fs: Option<String>,
    pub error: Option<String>,
    pub files: Vec<FileView>,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct FileView {
    pub path: String,
    pub size: u64,
    pub content_type: String,
    /// Where the file is served.
    pub url: String,
    /// Its player page (video and audio).
    pub play: Option<String>,
}

impl FileView {
    /// A file of the volume `lun` of storage `id`; `None` unless it is media.
    pub fn media(id: &str, lun: u16, path: &str, size: u64) -> Option<FileView> {
        let (t, media) = content_type(path);
        if !media {
            return None;
        }
        let tail = format!(
            "{}/{lun}{}",
            percent_encode_path(id),
            percent_encode_path(path)
        );
        let play =
            (t.starts_with("video/") || t.starts_with("audio/")).then(|| format!("/play/{tail}"));
        Some(FileView {
            path: path.to_owned(),
            size,
            content_type: t.to_owned(),
            url: format!("/media/{tail}"),
            play,
        })
    }
}

/// What a request path names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    Page,
    Json,
    File {
        storage: String,
        lun: u16,
        path: String,
    },
    Player {
        storage: String,
        lun: u16,
        path: String,
    },
    NotFound,
}

/// Routes a percent-encoded request path. File paths are normalised: empty and `.`
/// segments dropped; `..` is refused rather than resolved.
pub fn route(path: &str) -> Route {
    match path {
        "/" | "/index.html" => return Route::Page,
        "/api/media" => return Route::Json,
        _ => {}
    }
    let (play, rest) = if let Some(r) = path.strip_prefix("/media/") {
        (false, r)
    } else if let Some(r) = path.strip_prefix("/play/") {
        (true, r)
    } else {
        return Route::NotFound;
    };
    let mut it = rest.splitn(3, '/');
    let (Some(s), Some(l), Some(p)) = (it.next(), it.next(), it.next()) else {
        return Route::NotFound;
    };
    let (Some(storage), Ok(lun)) = (percent_decode(s), l.parse::<u16>()) else {
        return Route::NotFound;
    };
    let Some(p) = percent_decode(p) else {
        return Route::NotFound;
    };
    let mut parts = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => return Route::NotFound,
            s => parts.push(s),
        }
    }
    if parts.is_empty() || storage.is_empty() {
        return Route::NotFound;
    }
    let path = format!("/{}", parts.join("/"));
    if play {
        Route::Player { storage, lun, path }
    } else {
        Route::File { storage, lun, path }
    }
}

pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

const STYLE: &str = "body{font-family:sans-serif;margin:2em;max-width:60em}\
table{border-collapse:collapse;width:100%}td,th{text-align:left;padding:.2em .6em;\
border-bottom:1px solid #ddd}.state{color:#666}.err{color:#a00}";

impl Listing {
    pub fn html(&self) -> String {
        let mut h = format!(
            "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>Reservoir media</title>\
             <style>{STYLE}</style></head><body>\n<h1>Reservoir media</h1>\n"
        );
        if self.storages.is_empty() {
            h.push_str("<p>No storage found yet.</p>\n");
        }
        for s in &self.storages {
            h.push_str(&format!(
                "<h2>{}</h2>\n<p class=\"state\">{} at {} ({}, found by {})</p>\n",
                escape(&s.id),
                escape(&s.target),
                escape(&s.portal),
                escape(&s.state),
                escape(&s.found_by)
            ));
            if let Some(e) = &s.error {
                h.push_str(&format!("<p class=\"err\">{}</p>\n", escape(e)));
            }
            for v in &s.volumes {
                h.push_str(&format!(
                    "<h3>LUN {} ({})</h3>\n",
                    v.lun,
                    escape(v.fs.as_deref().unwrap_or("no file system"))
                ));
                if let Some(e) = &v.error {
                    h.push_str(&format!("<p class=\"err\">{}</p>\n", escape(e)));
                }
                if v.files.is_empty() {
                    continue;
                }
                h.push_str("<table><tr><th>file</th><th>size</th><th>type</th><th></th></tr>\n");
                for f in &v.files {
                    let play = f.play.as_ref().map_or(String::new(), |p| {
                        format!("<a class=\"play\" href=\"{}\">play</a>", escape(p))
                    });
                    h.push_str(&format!(
                        "<tr><td><a class=\"file\" href=\"{}\">{}</a></td><td>{}</td><td>{}</td><td>{play}</td></tr>\n",
                        escape(&f.url),
                        escape(&f.path),
                        units::Size(f.size).approx(),
                        escape(&f.content_type),
                    ));
                }
                h.push_str("</table>\n");
            }
        }
        h.push_str("</body></html>\n");
        h
    }

    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|_| "{}".into())
    }
}

/// The player page of a file: a `<video>` (or `<audio>`) that starts muted on its own, and
/// a line that says how far it has played (`#status`, `data-time`), for people and tests.
pub fn player(title: &str, src: &str, content_type: &str) -> String {
    let tag = if content_type.starts_with("audio/") {
        "audio"
    } else {
        "video"
    };
    format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>{STYLE}</style></head><body>\n<h1>{t}</h1>\n\
         <{tag} id=\"player\" src=\"{s}\" controls autoplay muted playsinline \
         style=\"max-width:100%\"></{tag}>\n\
         <p id=\"status\" data-time=\"0\">not started</p>\n<p><a href=\"/\">all media</a></p>\n\
         <script>\nconst v = document.getElementById('player');\n\
         const st = document.getElementById('status');\nlet best = 0;\n\
         function show(what) {{ best = Math.max(best, v.currentTime);\n\
           st.dataset.time = best.toFixed(2); st.textContent = what + ' at ' + best.toFixed(2) + ' s'; }}\n\
         v.addEventListener('timeupdate', () => show('playing'));\n\
         v.addEventListener('ended', () => show('ended'));\n\
         v.addEventListener('error', () => {{ st.textContent = 'error ' + (v.error ? v.error.code : '?'); }});\n\
         v.play().catch(e => {{ st.textContent = 'play refused: ' + e; }});\n\
         </script>\n</body></html>\n",
        t = escape(title),
        s = escape(src),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(route("/"), Route::Page);
        assert_eq!(route("/api/media"), Route::Json);
        assert_eq!(
            route("/media/home%20media/0/v/a%20b.webm"),
            Route::File {
                storage: "home media".into(),
                lun: 0,
                path: "/v/a b.webm".into()
            }
        );
        assert_eq!(
            route("/play/h/3//./x.mp4"),
            Route::Player {
                storage: "h".into(),
                lun: 3,
                path: "/x.mp4".into()
            }
        );
        for bad in [
            "/media/h/0/../etc/passwd",
            "/media/h/x/a.mp4",
            "/media/h/0/",
            "/media/h/0",
            "/media//0/a",
            "/media/h/0/%zz",
            "/nothing",
            "/media/h/99999/a",
        ] {
            assert_eq!(route(bad), Route::NotFound, "{bad}");
        }
    }

    #[test]
    fn files_and_pages() {
        let f = FileView::media("home media", 0, "/v/<clip>.webm", 2048).unwrap();
        assert_eq!(f.url, "/media/home%20media/0/v/%3Cclip%3E.webm");
        assert_eq!(
            f.play.as_deref(),
            Some("/play/home%20media/0/v/%3Cclip%3E.webm")
        );
        assert!(FileView::media("h", 0, "/notes.txt", 1).is_none());
        let l = Listing {
            storages: vec![StorageView {
                id: "home media".into(),
                target: "iqn.x:y".into(),
                alias: Some("home media".into()),
                portal: "127.0.0.1:3260".into(),
                found_by: "isns".into(),
                state: "open".into(),
                error: None,
                volumes: vec![VolumeView {
                    lun: 0,
                    fs: Some("ext4".into()),
                    error: None,
                    files: vec![f],
                }],
            }],
        };
        let h = l.html();
        assert!(h.contains("&lt;clip&gt;.webm"), "{h}");
        assert!(!h.contains("<clip>"), "{h}");
        assert!(h.contains("<td>2KiB</td>"), "{h}");
        let j: serde_json::Value = serde_json::from_str(&l.json()).unwrap();
        assert_eq!(j["storages"][0]["volumes"][0]["files"][0]["size"], 2048);
        let p = player("a\"b", "/media/x/0/a.webm", "video/webm");
        assert!(
            p.contains("<video id=\"player\" src=\"/media/x/0/a.webm\""),
            "{p}"
        );
        assert!(p.contains("<title>a&quot;b</title>"), "{p}");
    }
}
