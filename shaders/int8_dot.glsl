// The integer dot product of four signed bytes: OpSDotKHR (SPV_KHR_integer_dot_product) on two
// 32-bit words of four signed bytes each, the sum of the four products. glslc 2023.2 has no GLSL
// built-in for it. Capabilities: DotProduct (6019), DotProductInput4x8BitPacked (6018); the
// literal 0 names the packed 4 x 8-bit format. Needs the device's shaderIntegerDotProduct.
#extension GL_EXT_spirv_intrinsics : require

spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot_packed(int a, int b, spirv_literal int packed_vector_format);
int dot4x8(uint a, uint b) { return sdot_packed(int(a), int(b), 0); }
