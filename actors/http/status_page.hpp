// The status page at / (actors/http/status_page.html, embedded at build time): one HTML file
// with inline CSS and JS that polls /api/status?history=1 and draws its plots itself, so it
// loads nothing from anywhere else and works on a machine without network access.
#pragma once

#include <string_view>

namespace mqlm::actors::status_page {

std::string_view html();

// Sent with the page: it may talk to this server only, and load nothing from anywhere.
inline constexpr std::string_view kContentSecurityPolicy =
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

}  // namespace mqlm::actors::status_page
