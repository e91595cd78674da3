"""What a batch leaves at its end: profile_outputs (a profile's tables and figures as files),
page (one HTML report page per profile, its notebooks executed), page_header (the page's facts
and warnings). The top room: it may import every other room of kit.results."""
