// Writes the chat template fuzzer's seed corpus: small templates written as real ones are
// (ChatML, Llama 3 with tools, Mistral's role checks, macros and namespaces), and pieces that
// reach every part of the language (whitespace control, filters, tests, slices, call blocks).
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_support.hpp"

int main(int argc, char** argv) {
  const auto dir = mqlm::fuzz::seed_dir(argc, argv);
  if (dir.empty()) return 2;
  const std::vector<std::string> templates = {
      "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
      "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
      "{{- bos_token }}{%- if tools is not none %}{%- for t in tools %}{{- t | tojson(indent=4) }}\n\n{%- endfor %}"
      "{%- endif %}{%- for m in messages %}{%- if m.tool_calls is defined %}{%- for c in m.tool_calls %}"
      "{{- '{\"name\": \"' + c.function.name + '\", \"parameters\": ' + c.function.arguments | tojson + '}' }}"
      "{%- endfor %}{%- else %}{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content | trim }}"
      "{%- endif %}{%- endfor %}",
      "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% else %}"
      "{% set loop_messages = messages %}{% endif %}{% for message in loop_messages %}"
      "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('roles must alternate') }}"
      "{% endif %}[INST] {{ message['content'] }}{% endfor %}",
      "{% set ns = namespace(found=false, n=0) %}{% for m in messages | selectattr('role', 'equalto', 'user') %}"
      "{% set ns.n = ns.n + 1 %}{% endfor %}{% macro show(x, sep=', ') %}{{ x | join(sep) }}{% endmacro %}"
      "{{ show(messages | map(attribute='role') | list) }} {{ ns.n }}",
      "  {%- raw %}{{ x }}{% endraw -%}\n{# c #}{{ 'a\\tb'[::-1] }}{{ [1, 2, 3][1:] }}{{ {'k': none} | tojson }}",
      "{% macro box() %}[{{ caller() }}]{% endmacro %}{% call box() %}{% filter upper %}x{% endfilter %}{% endcall %}"
      "{{ strftime_now('%d %b %Y') }}{{ range(3) | list | length is divisibleby 3 }}",
      "{% for k, v in tools[0].function.parameters.properties | dictsort %}{{ k }}={{ v.type }}{% if not loop.last %},"
      "{% endif %}{% else %}none{% endfor %}{{ '%d' if 1 else 2 }}{{ 'a b'.split() }}",
  };
  for (std::size_t i = 0; i < templates.size(); ++i) {
    if (!mqlm::fuzz::write_seed(dir, "template-" + std::to_string(i), templates[i])) return 1;
  }
  std::printf("wrote %zu seeds to %s\n", templates.size(), dir.c_str());
  return 0;
}
