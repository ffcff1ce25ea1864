// server/dashboard.h — the page served at GET /: self-contained HTML + JS (no external scripts, fonts or CDNs) that
// opens the /v1/telemetry event stream and draws memory by tier/account, cache hit rate and tok/s on canvases.
// It holds no data itself (served without the key); with an API key on the server it asks for the key on 401.
#pragma once

#include <string_view>

namespace tierlm::server {

std::string_view dashboard_html();

}  // namespace tierlm::server
