// Built only under MQLM_SANITIZE=address,undefined (cmake/sanitizers.cmake) and linked into every
// executable: dlclose does nothing, so a shared library, once loaded, stays until the process ends.
//
// Why: Mesa's lavapipe, the Vulkan driver the tests run on, keeps a 128-byte block from a one-time
// initialisation (a pthread_once inside vkEnumeratePhysicalDevices) in a global of its own, and
// the Vulkan loader unloads the driver in vkDestroyInstance. LeakSanitizer looks at exit: the block
// is then reachable from no loaded module, and the leak's stack is a row of "<unknown module>"
// frames that no suppression can name. With the driver loaded, its globals are scanned and the
// block is reachable, as it is in Mesa. A leak of mqlm's own is still reported.
#include <dlfcn.h>

extern "C" int dlclose(void*) noexcept { return 0; }
