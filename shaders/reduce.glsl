// Workgroup-wide sum and max over any subgroup size: subgroup reduction, then one value per
// subgroup through shared memory. Every invocation of the workgroup must call these.
shared float reduce_scratch[64];

float workgroup_sum(float v) {
  v = subgroupAdd(v);
  barrier();
  if (subgroupElect()) reduce_scratch[gl_SubgroupID] = v;
  barrier();
  float s = 0.0;
  for (uint g = 0; g < gl_NumSubgroups; ++g) s += reduce_scratch[g];
  return s;
}

float workgroup_max(float v) {
  v = subgroupMax(v);
  barrier();
  if (subgroupElect()) reduce_scratch[gl_SubgroupID] = v;
  barrier();
  float m = reduce_scratch[0];
  for (uint g = 1; g < gl_NumSubgroups; ++g) m = max(m, reduce_scratch[g]);
  return m;
}
