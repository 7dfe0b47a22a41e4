# Writes OUTPUT: a C++ file holding INPUT (the status page) as a byte array and
# mqlm::actors::status_page::html() returning it; run as `cmake -DINPUT=.. -DOUTPUT=.. -P`.
file(READ ${INPUT} hex HEX)
string(LENGTH "${hex}" hex_length)
math(EXPR bytes "${hex_length} / 2")
string(REGEX REPLACE "(..)" "0x\\1," body "${hex}")
# One line per 32 bytes keeps the file readable to an editor.
string(REGEX REPLACE "((0x..,){32})" "\\1\n" body "${body}")
file(WRITE ${OUTPUT}.tmp "// Generated from actors/http/status_page.html by actors/http/embed_page.cmake: do not edit.
#include \"actors/http/status_page.hpp\"

namespace mqlm::actors::status_page {
namespace {
const unsigned char kPage[${bytes}] = {
${body}};
}  // namespace

std::string_view html() { return {reinterpret_cast<const char*>(kPage), sizeof(kPage)}; }

}  // namespace mqlm::actors::status_page
")
file(COPY_FILE ${OUTPUT}.tmp ${OUTPUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUTPUT}.tmp)
