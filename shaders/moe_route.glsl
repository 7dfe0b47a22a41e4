// A token's routing from its router logits, as moe_route makes it (gpu::reference::moe_route
// says what): its `used` experts of highest logit, the lower index first on ties, and their
// weights exp(logit - the top logit) over those exponentials' sum (in pick order). Every
// invocation of the workgroup calls route_token; after it, route_experts[j] and route_weights[j]
// are the token's j-th pick (j < used). The logits at binding ROUTE_LOGITS_BINDING: (rows,
// n_expert), n_expert <= ROUTE_MAX_EXPERTS, used <= ROUTE_MAX_USED and at most the workgroup's
// size. NaN logits rank as -inf.
//
// Each expert's rank is the number of experts ahead of it, counted over the logits in shared memory
// by up to four neighbouring invocations (as many as the workgroup has for every expert) and summed
// by shuffles: three barriers a token, where picking the best `used` times took a barrier and a
// workgroup-wide argmax each (qwen3moe-30b-a3b decode: 8.5 us a layer for a dispatch of its own on
// the H200, which matvec_experts_glu no longer needs).
#extension GL_KHR_shader_subgroup_shuffle : require
const uint ROUTE_MAX_EXPERTS = 1024, ROUTE_MAX_USED = 64;
layout(binding = ROUTE_LOGITS_BINDING) readonly buffer RouteLogits { float route_logits[]; };
shared vec4 route_values[ROUTE_MAX_EXPERTS / 4];  // -inf past n_expert
shared float route_picked[ROUTE_MAX_USED];        // the picks' logits
shared uint route_experts[ROUTE_MAX_USED];
shared float route_weights[ROUTE_MAX_USED];

// 1 where expert f's logit w ranks ahead of expert e's v.
uint route_ahead(float w, uint f, float v, uint e) { return w > v || (w == v && f < e) ? 1u : 0u; }

void route_token(uint row, uint n_expert, uint used) {
  const float NEG_INF = uintBitsToFloat(0xFF800000u);
  const uint tid = gl_LocalInvocationIndex, threads = gl_WorkGroupSize.x, quads = (n_expert + 3) / 4;
  for (uint i = tid; i < 4 * quads; i += threads) {
    const float v = i < n_expert ? route_logits[row * n_expert + i] : NEG_INF;
    route_values[i / 4][i % 4] = isnan(v) ? NEG_INF : v;
  }
  barrier();
  // Invocations 4e .. 4e + 3 (or 2e, 2e + 1, or e alone) count expert e's rank, each every parts-th
  // quad of logits; they enter and leave the loop together.
  const uint parts = threads >= 4 * n_expert ? 4 : threads >= 2 * n_expert ? 2 : 1;
  for (uint i = tid; i < parts * n_expert; i += threads) {
    const uint e = i / parts;
    const float v = route_values[e / 4][e % 4];
    uint rank = 0;
    for (uint q = i % parts; q < quads; q += parts) {  // the padding's -inf past n_expert never ranks ahead
      const vec4 w = route_values[q];
      rank += route_ahead(w.x, 4 * q, v, e) + route_ahead(w.y, 4 * q + 1, v, e) + route_ahead(w.z, 4 * q + 2, v, e) +
              route_ahead(w.w, 4 * q + 3, v, e);
    }
    if (parts > 1) rank += subgroupShuffleXor(rank, 1u);
    if (parts > 2) rank += subgroupShuffleXor(rank, 2u);
    if (i % parts == 0 && rank < used) {
      route_experts[rank] = e;
      route_picked[rank] = v;
    }
  }
  barrier();
  if (tid < used) {  // each pick's weight, the sum taken in pick order by each
    const float top = route_picked[0];
    float sum = 0.0;
    for (uint j = 0; j < used; ++j) sum += exp(route_picked[j] - top);
    route_weights[tid] = exp(route_picked[tid] - top) / sum;
  }
  barrier();
}
