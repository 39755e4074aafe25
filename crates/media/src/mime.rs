//! Content types by file extension, for the media a home library holds.

/// The content type of `name` by its extension (any case), and whether it is media
/// (video, audio, image, subtitles) that the listing shows.
pub fn content_type(name: &str) -> (&'static str, bool) {
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    let t = match ext.as_str() {
        "mp4" | "m4v" => "video/mp4",
        "webm" => "video/webm",
        "mkv" => "video/x-matroska",
        "mov" => "video/quicktime",
        "avi" => "video/x-msvideo",
        "ogv" => "video/ogg",
        "ts" | "m2ts" => "video/mp2t",
        "mpg" | "mpeg" => "video/mpeg",
        "mp3" => "audio/mpeg",
        "m4a" => "audio/mp4",
        "aac" => "audio/aac",
        "flac" => "audio/flac",
        "wav" => "audio/wav",
        "ogg" | "oga" => "audio/ogg",
        "opus" => "audio/opus",
        "jpg" | "jpeg" => "image/jpeg",
        "png" => "image/png",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "vtt" => "text/vtt",
        "srt" => "application/x-subrip",
        "txt" => "text/plain; charset=utf-8",
        "html" | "htm" => "text/html; charset=utf-8",
        "json" => "application/json",
        "pdf" => "application/pdf",
        _ => "application/octet-stream",
    };
    let media = t.starts_with("video/")
        || t.starts_with("audio/")
        || t.starts_with("image/")
        || ext == "vtt"
        || ext == "srt";
    (t, media)
}

#[cfg(test)]
mod tests {
    use super::content_type;

    #[test]
    fn types() {
        assert_eq!(content_type("a/b/Clip.MP4"), ("video/mp4", true));
        assert_eq!(content_type("x.webm"), ("video/webm", true));
        assert_eq!(content_type("song.flac"), ("audio/flac", true));
        assert!(!content_type("notes.txt").1);
        assert_eq!(content_type("noext"), ("application/octet-stream", false));
        assert_eq!(content_type(".hidden"), ("application/octet-stream", false));
    }
}
